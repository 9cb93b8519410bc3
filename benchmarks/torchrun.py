"""torch's processes started by the shim against the same script under torchrun.

The digits classifier of examples/digits.py (scikit-learn's digits, Keras on
torch) trains on N CPU processes four ways, each in fresh processes:

- shim: `python script.py` with AGNOSTIC_CPU_DEVICES=N (the shim starts the
  other processes itself, as torch is imported: docs/processes.md);
- shim at compile: the same with AGNOSTIC_START_EARLY=0 (the other processes
  started at backend_agnostic_compile);
- launch: `agnostic launch --standalone --nproc-per-node N script.py`;
- torchrun: `torchrun --standalone --nproc-per-node N script.py`.

A second torchrun run in each repeat ("torchrun again") is the noise floor:
its ratio to the first is what chance alone gives. The five alternate (each
repeat rotates the order, so that going first favours none); each run's
median step time after its first epoch (a warm-up) is rank 0's; the report
gives each way's median over repeats and the median and spread of its
per-repeat ratio to that repeat's torchrun run. The wall time of each whole
command (start to exit: the interpreters' imports, the join, the training)
is measured too, and compared the same way. The user's OMP_NUM_THREADS is
removed first: what is measured is what each starter chooses when the user
chose nothing.

    python benchmarks/torchrun.py                # a few minutes
    python benchmarks/torchrun.py --smoke        # checks it runs
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SCRIPT = os.path.abspath(__file__)
WAYS = ("shim", "shim at compile", "launch", "torchrun", "torchrun again")


def child(options):
    """One process of the training run (any starter); rank 0 writes its steps."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    from sklearn.datasets import load_digits

    import agnostic

    digits = load_digits()
    x = np.tile((digits.data[:1792] / 16.0).astype("float32"), (options.copies, 1))
    y = np.tile(digits.target[:1792], options.copies)
    keras.utils.set_random_seed(0)
    inputs = keras.layers.Input(shape=(64,))
    hidden = keras.layers.Dense(options.width, activation="relu")(inputs)
    hidden = keras.layers.Dense(options.width, activation="relu")(hidden)
    outputs = keras.layers.Dense(10, activation="softmax")(hidden)
    model = keras.models.Model(inputs, outputs)
    agnostic.backend_agnostic_compile(model, loss="sparse_categorical_crossentropy",
                                      optimizer="adam")
    timer = common.step_timer(keras)
    model.fit(x, y, batch_size=options.batch, epochs=options.epochs, verbose=0,
              callbacks=[timer])
    steps_per_epoch = len(timer.seconds) // options.epochs
    if agnostic.resolve().process_id == 0:
        import torch

        with open(options.result, "w") as handle:
            json.dump({"ms_per_step": 1000 * common.median(timer.seconds[steps_per_epoch:]),
                       "threads": torch.get_num_threads(),
                       "processes": agnostic.resolve().num_processes}, handle)


def command(way, options, result):
    arguments = [SCRIPT, "--child", "--result", result, "--batch", str(options.batch),
                 "--epochs", str(options.epochs), "--width", str(options.width),
                 "--copies", str(options.copies)]
    n = str(options.processes)
    if way.startswith("shim"):
        return [sys.executable] + arguments
    if way == "launch":
        return [sys.executable, "-m", "agnostic", "launch", "--standalone",
                "--nproc-per-node", n] + arguments
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", n] + arguments


def run(way, options, folder):
    result = os.path.join(folder, f"{way.replace(' ', '-')}.json")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "AGNOSTIC_CPU_DEVICES")}
    env.update(KERAS_BACKEND="torch", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=common.ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    if way.startswith("shim"):
        env["AGNOSTIC_CPU_DEVICES"] = str(options.processes)
    if way == "shim at compile":  # its other processes started there, not early
        env["AGNOSTIC_START_EARLY"] = "0"
    began = time.monotonic()
    done = subprocess.run(command(way, options, result), env=env, cwd=common.ROOT,
                          capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"{way} failed:\n{done.stderr[-4000:]}")
    with open(result) as handle:
        return dict(json.load(handle), wall_s=wall)


def row(way, runs):
    """One way's figures: step and wall time, medians over the repeats, and
    the per-repeat ratios to that repeat's torchrun run."""
    found = {"way": way, "threads": runs[way][0]["threads"],
             "processes": runs[way][0]["processes"]}
    for key, prefix in (("ms_per_step", ""), ("wall_s", "wall_")):
        times = [r[key] for r in runs[way]]
        ratios = [t / r[key] for t, r in zip(times, runs["torchrun"])]
        found[key] = common.median(times)
        found[prefix + "min"], found[prefix + "max"] = min(times), max(times)
        found[prefix + "ratio"] = common.median(ratios)
        found[prefix + "ratio_min"], found[prefix + "ratio_max"] = min(ratios), max(ratios)
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--copies", type=int, default=2, help="the digits repeated")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", default=os.path.join(common.ROOT, "benchmarks", "results"))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it runs")
    options = parser.parse_args(argv)
    if options.child:
        return child(options)
    if options.smoke:
        options.epochs, options.repeats, options.copies = 2, 1, 1
        options.out = os.path.join(options.out, "smoke")
    folder = tempfile.mkdtemp(prefix="agnostic-torchrun-bench-")
    runs = {way: [] for way in WAYS}
    try:
        for order in common.rotations(list(WAYS), options.repeats):
            for way in order:
                runs[way].append(run(way, options, folder))
                print(f"{way}: {runs[way][-1]}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows = [row(way, runs) for way in WAYS]
    table = ["| started by | processes | threads | ms/step | spread | ratio to torchrun "
             "| wall s | spread | wall ratio to torchrun |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        table.append(
            f"| {r['way']} | {r['processes']} | {r['threads']} | {r['ms_per_step']:.1f} | "
            f"{r['min']:.1f}-{r['max']:.1f} | {r['ratio']:.2f} ({r['ratio_min']:.2f}-"
            f"{r['ratio_max']:.2f}) | {r['wall_s']:.1f} | {r['wall_min']:.1f}-"
            f"{r['wall_max']:.1f} | {r['wall_ratio']:.2f} ({r['wall_ratio_min']:.2f}-"
            f"{r['wall_ratio_max']:.2f}) |")
    # The job's settings (not where this run wrote, which is this machine's).
    settings = {k: v for k, v in vars(options).items() if k not in ("child", "result", "out")}
    common.write(options.out, "torchrun", {"settings": settings, "rows": rows},
                 "\n".join(table))
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
