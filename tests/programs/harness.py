"""What lets one ordinary Keras program run two ways: `model.compile` on one
device (`plain`), or `backend_agnostic_compile` on 2 devices (`agnostic`).

A program is written as a keras.io example is, except that it compiles
through `harness.compile(model, ...)` and ends with `harness.finish(...)`.
Run it as `python tests/programs/NAME.py plain|agnostic FOLDER`: the chief
writes FOLDER/MODE.npz (the weights) and FOLDER/MODE.json (history,
evaluation, anything else the program reports).
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tests.programs.held import bytes_per_device, watch  # noqa: E402

MODE, FOLDER = sys.argv[1], sys.argv[2]
if MODE == "agnostic":
    # Imported before the program builds its model, as a user's script
    # imports it at its top: agnostic sets the engine up (the CPU split, a
    # job's workers) before the engine's runtime starts.
    import agnostic  # noqa: E402, F401
REPLICAS = int(os.environ.get("AGNOSTIC_TEST_REPLICAS", "2"))
DIGITS_VARIABLE = "AGNOSTIC_TEST_DIGITS"
ENGINE = keras.backend.backend()


def compile(model, *args, **kwargs):
    """`model.compile(...)` on one device, or agnostic's on REPLICAS: the
    literal swap, its return value ignored (the program goes on with its
    own model, as a user's does)."""
    if MODE == "plain":
        model.compile(*args, **kwargs)
        return model
    import agnostic

    sync = os.environ.get("AGNOSTIC_TEST_SYNC_BATCH_NORM", "1") == "1"
    whole = os.environ.get("AGNOSTIC_TEST_GLOBAL_VIEW", "1") == "1"
    shard = os.environ.get("AGNOSTIC_TEST_SHARD", "0") == "1"
    agnostic.backend_agnostic_compile(model, *args, gpus=REPLICAS, sync_batch_norm=sync,
                                      global_view=whole, shard=shard, **kwargs)
    if shard:
        watch(model)
    return model


def devices_used(model):
    """How many devices (torch: processes) hold the model's first weight:
    TensorFlow's mirrored copies, JAX's mesh, torch's process group."""
    weight = model.weights[0].value
    if ENGINE == "tensorflow":
        return len(getattr(weight, "values", (weight,)))
    if ENGINE == "jax":
        return len(weight.sharding.device_set)
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


def is_chief(model=None):
    """Whether this process is the chief; `model`: the one compiled (its
    placements decide the processes of device parallelism)."""
    if MODE == "plain":
        return True
    import agnostic

    return agnostic.resolve(gpus=REPLICAS, model=model).process_id == 0


def path(name):
    """A file of this run's own, in FOLDER."""
    return os.path.join(FOLDER, f"{MODE}-{name}")


def digits(samples=256, images=False):
    """scikit-learn's bundled digits, as sklearn.datasets.load_digits reads
    them (its file, digits_file()): x in [0, 1], y in 0..9."""
    table = np.loadtxt(digits_file(), delimiter=",")
    data, target = table[:, :-1], table[:, -1].astype(int)
    x = (data[:samples] / 16.0).astype("float32")
    if images:
        x = x.reshape(-1, 8, 8, 1)
    return x, target[:samples]


def digits_file():
    """The digits' file that scikit-learn ships: where DIGITS_VARIABLE says
    (tox.ini installs scikit-learn outside the environment's packages, as
    Keras imports scikit-learn as it is imported wherever it is installed:
    a second or so per process), else in an installed scikit-learn (found,
    not imported)."""
    import importlib.util

    path = os.environ.get(DIGITS_VARIABLE)
    if not path:
        spec = importlib.util.find_spec("sklearn")
        if spec is None or not spec.origin:
            raise RuntimeError(
                "The test programs train on scikit-learn's digits, and scikit-learn "
                f"is not installed and {DIGITS_VARIABLE} is not set. Install it "
                "(pip install scikit-learn), or set "
                f"{DIGITS_VARIABLE}=.../sklearn/datasets/data/digits.csv.gz.")
        path = os.path.join(os.path.dirname(spec.origin), "datasets", "data",
                            "digits.csv.gz")
    if not os.path.isfile(path):
        where = f"{DIGITS_VARIABLE}={path!r}" if os.environ.get(DIGITS_VARIABLE) else path
        raise RuntimeError(f"{where}: no such file; expected scikit-learn's "
                           "sklearn/datasets/data/digits.csv.gz.")
    return path


def replica_spread(model):
    """The largest difference between the copies of a weight on the devices:
    TensorFlow's mirrored variables, torch's processes (every process must
    call this); 0 where each weight has one copy."""
    if ENGINE == "torch":
        return _process_spread(model)
    spread = 0.0
    if ENGINE != "tensorflow":
        return spread
    for weight in model.weights:
        copies = [np.asarray(c) for c in getattr(weight.value, "values", ())]
        for copy in copies[1:]:
            spread = max(spread, float(np.abs(copy - copies[0]).max()))
    return spread


def _process_spread(model):
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return 0.0
    spread = 0.0
    for weight in model.weights:
        value = weight.value.detach().clone()
        highest, lowest = value.clone(), value.clone()
        dist.all_reduce(highest, op=dist.ReduceOp.MAX)
        dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
        spread = max(spread, float(torch.max(highest - lowest)))
    return spread


def finish(model, history=None, evaluation=None, **extra):
    """The chief records what the test compares with the other run."""
    if not is_chief(model):
        return
    np.savez(os.path.join(FOLDER, f"{MODE}.npz"), *model.get_weights())
    history = history.history if hasattr(history, "history") else (history or {})
    report = {
        "history": {k: [float(v) for v in values] for k, values in history.items()},
        "evaluation": _plain(evaluation),
        "devices_used": devices_used(model) if model.weights else 0,
    }
    # What each device holds. (A run with it set starts fresh: the warm
    # interpreter shares plain runs whatever the harness's variables say.)
    if os.environ.get("AGNOSTIC_TEST_SHARD") == "1":
        report["bytes_per_device"] = bytes_per_device(model)
    report.update({key: _plain(value) for key, value in extra.items()})
    with open(os.path.join(FOLDER, f"{MODE}.json"), "w") as handle:
        json.dump(report, handle)


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, bool)):
        return value
    return np.asarray(value).astype("float64").tolist()
