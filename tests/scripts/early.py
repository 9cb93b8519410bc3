"""The shim's torch workers started early (agnostic/launch/early.py), run as
`python early.py FOLDER GPUS [MODE]` or `python -m tests.scripts.early ...`.

Each process that runs this script writes FOLDER/rank_<r>.json: its pid, when
it started (clock ticks since boot), whether it runs in the process started
to wait, its __name__ and arguments, and, in rank 0, when it reached the
compile line, the processes it started that are still alive there, and the
weights it trained. MODE: `set-after-import` sets a variable Keras reads as
it is imported after the engine's import; `raise` makes rank 1 fail before
the compile line; `no-compile` never calls backend_agnostic_compile; `fork`:
rank 0 forks a process (as a data loader's workers are) before the compile
line, which lives until the training has ended.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402

import agnostic  # noqa: E402
from tests import models  # noqa: E402

FOLDER, GPUS = sys.argv[1], int(sys.argv[2])
MODE = sys.argv[3] if len(sys.argv) > 3 else ""
RANK = int(os.environ.get("RANK", "0"))


def ticks_at_start(pid="self"):
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[19])


def ticks_now():
    with open("/proc/uptime") as handle:
        return float(handle.read().split()[0]) * os.sysconf("SC_CLK_TCK")


def children():
    """This process's children still running."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        if name.isdigit() and int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.append(int(name))
    return found


if MODE == "fork" and RANK == 0:  # a process forked before the compile line
    import multiprocessing
    import time

    holder = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,),
                                                         daemon=True)
    holder.start()
if MODE == "set-after-import":
    os.environ["KERAS_EARLY_START_TEST"] = "1"
if MODE == "raise" and RANK == 1:
    raise ValueError("a mistake in rank 1's script")
record = {"pid": os.getpid(), "started": ticks_at_start(), "name": __name__,
          "waited": "agnostic._waiting" in " ".join(sys.orig_argv),
          "arguments": sys.argv[1:]}
x, y = models.data()
model = models.build(keras)
record["compile"] = ticks_now()
if MODE == "no-compile":
    record["children"] = children()
else:
    agnostic.backend_agnostic_compile(model, optimizer=models.sgd(keras), gpus=GPUS,
                                      **models.COMPILE)
    record["children"] = children()
    model.fit(x, y, batch_size=models.BATCH, epochs=models.EPOCHS, shuffle=False, verbose=0)
    record["weights"] = [w.tolist() for w in model.get_weights()]
if MODE == "fork" and RANK == 0:
    holder.terminate()
with open(os.path.join(FOLDER, f"rank_{RANK}.json"), "w") as handle:
    json.dump(record, handle)
