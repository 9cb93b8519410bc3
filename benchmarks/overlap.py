"""How much of torch-ddp's gradient communication backward hides.

On torch across processes the shim sums gradients in buckets, each sent as
soon as backward has produced its gradients (as DistributedDataParallel
does), so that sending overlaps the rest of backward. This measures, per
step, the step time and the time the optimizer step still waits for the
sums, two ways in the same processes: the default buckets, and one bucket
holding every gradient, which can only leave once backward is over (no
overlap). Same model and data as overhead.py; the two alternate after a
warm-up.

    python benchmarks/overlap.py                 # 2 and 4 processes
    python benchmarks/overlap.py --smoke         # seconds: checks it runs
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import overhead  # noqa: E402

SCRIPT = os.path.abspath(__file__)
WAYS = ("buckets", "one_bucket")


def child(options):
    import keras
    import numpy as np

    import agnostic
    from agnostic.strategies import torch_reduce

    x = np.random.default_rng(0).normal(size=(options.batch * options.steps,
                                              options.features)).astype("float32")
    y = np.random.default_rng(1).integers(0, 10, len(x))
    models, waits = {}, {}
    default = torch_reduce.BUCKET_BYTES, torch_reduce.FIRST_BUCKET_BYTES
    for way in WAYS:
        if way == "one_bucket":
            torch_reduce.BUCKET_BYTES = torch_reduce.FIRST_BUCKET_BYTES = 1 << 50
        models[way] = agnostic.backend_agnostic_compile(
            overhead.build(keras, options.width, options.features),
            loss="sparse_categorical_crossentropy", optimizer="sgd", gpus=options.devices)
        waits[way] = wait_timer(models[way]._agnostic_reducer)
    torch_reduce.BUCKET_BYTES, torch_reduce.FIRST_BUCKET_BYTES = default
    for model in models.values():  # warm-up
        model.fit(x, y, batch_size=options.batch, epochs=1, verbose=0)
    result = {way: {"step_ms": [], "wait_ms": [], "buckets": 0} for way in WAYS}
    for order in common.rotations(WAYS, options.repeats):
        for way in order:
            timer = common.step_timer(keras)
            waits[way].clear()
            models[way].fit(x, y, batch_size=options.batch, epochs=1, verbose=0,
                            shuffle=False, callbacks=[timer])
            result[way]["step_ms"].append(1000 * common.median(timer.seconds))
            result[way]["wait_ms"].append(1000 * common.median(waits[way]))
            result[way]["buckets"] = len(models[way]._agnostic_reducer.buckets)
    if agnostic.resolve(gpus=options.devices).process_id == 0:
        print(json.dumps(result))


def wait_timer(reducer):
    """Records how long each call of `reducer.average` takes."""
    seconds, average = [], reducer.average

    def timed(gradients, variables):
        began = time.perf_counter()
        average(gradients, variables)
        seconds.append(time.perf_counter() - began)

    reducer.average = timed
    return seconds


def table(results):
    rows = ["| processes | buckets | step ms | waiting for sums ms | one bucket after backward: "
            "step ms | waiting ms |", "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        rows.append(f"| {r['devices']} | {r['buckets']} | {r['step_ms']:.1f} | "
                    f"{r['wait_ms']:.1f} | {r['one_bucket_step_ms']:.1f} | "
                    f"{r['one_bucket_wait_ms']:.1f} |")
    return "\n".join(rows)


def main():
    options = common.model_options(__doc__, devices="2,4", repeats=6).parse_args()
    if options.child:
        options.devices = int(options.devices)
        child(options)
        return 0
    if options.smoke:
        common.smoke_sizes(options)
    results = []
    for devices in map(int, options.devices.split(",")):
        arguments = common.child_arguments(options, devices)
        measured = common.run_child(SCRIPT, arguments, "torch", devices)
        row = {"devices": devices, "buckets": measured["buckets"]["buckets"]}
        for way in WAYS:
            prefix = "" if way == "buckets" else way + "_"
            for name in ("step_ms", "wait_ms"):
                row[prefix + name] = common.median(measured[way][name])
            row[prefix + "step_ms_each"] = measured[way]["step_ms"]
        results.append(row)
        print(table(results[-1:]).splitlines()[-1], flush=True)
    common.write(options.out, "overlap", results, table(results))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
