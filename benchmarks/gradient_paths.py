"""torch's two ways of averaging gradients across processes, against each other.

torch-ddp averages each training step's gradients in torch's
DistributedDataParallel while backward runs, when the step calls the model;
a step that never does (a GAN's, which calls its parts) or that leaves some
weight without a gradient has them averaged when the optimizer gets them,
after backward, with no overlap. This measures what that second way costs
on the same model, in the same processes:

- ddp: the shim as it is (DistributedDataParallel's buckets during backward);
- optimizer: the same model, its steps averaged at the optimizer;
- ddp again: a second DistributedDataParallel model, the noise floor.

The three alternate (each repeat rotates the order), after a warm-up; each
repeat gives each way's median step time on rank 0. The report gives the
medians and the median and spread of the per-repeat ratios to ddp, and the
largest difference between the ddp and optimizer models' weights after
training from the same weights on the same batches (both average the same
gradients, so it is rounding).

    python benchmarks/gradient_paths.py                  # 2 and 4 processes
    python benchmarks/gradient_paths.py --smoke          # checks it runs

On CPU the processes share the machine's cores, so communication and
computation compete for them; what overlap saves on several GPUs (NCCL's
all-reduce while backward runs) is measured by running it there, where
`--devices` counts GPUs.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import overhead  # noqa: E402

SCRIPT = os.path.abspath(__file__)
WAYS = ("ddp", "optimizer", "ddp again")


def child(options):
    import keras
    import numpy as np

    import agnostic
    from agnostic.compat import torch_keras_ddp

    x = np.random.default_rng(0).normal(size=(options.batch * options.steps,
                                              options.features)).astype("float32")
    y = np.random.default_rng(1).integers(0, 10, len(x))
    models = {}
    for way in WAYS:
        models[way] = agnostic.backend_agnostic_compile(
            overhead.build(keras, options.width, options.features),
            loss="sparse_categorical_crossentropy", optimizer="sgd", gpus=options.devices)
        if torch_keras_ddp.keras_averages_gradients(models[way]):
            return {"skipped": f"Keras {keras.__version__} averages the gradients of its own "
                               "train_step itself (its DistributedDataParallel): agnostic's two "
                               "ways are used on Keras 3.13-3.15, or for a train_step of the "
                               "program's own"}
        if way == "optimizer":
            # The switch a step that leaves a weight without a gradient makes
            # (engines/torch/gradients.py): no DistributedDataParallel.
            models[way].__dict__["_agnostic_gradients"].whole = False
    for model in models.values():  # warm-up
        model.fit(x, y, batch_size=options.batch, epochs=1, verbose=0, shuffle=False)
    difference = _largest_difference(models["ddp"], models["optimizer"])
    steps = common.timed_epochs(keras, models, WAYS, x, y, options.batch, options.repeats)
    paths = {way: models[way].__dict__["_agnostic_gradients"].at_optimizer for way in WAYS}
    return {"steps": steps, "at_optimizer": paths, "weight_difference": difference}


def _largest_difference(one, other):
    """The largest weight difference, relative to the largest weight."""
    import numpy as np

    pairs = list(zip(one.get_weights(), other.get_weights()))
    largest = max(float(np.abs(a).max()) for a, _ in pairs)
    return max(float(np.abs(a - b).max()) for a, b in pairs) / largest


def measure(devices, options):
    found = common.run_child(SCRIPT, common.child_arguments(options, devices), "torch", devices)
    if "skipped" in found:
        print(f"{devices} processes: not measured: {found['skipped']}.")
        return None
    steps = found["steps"]
    if found["at_optimizer"]["ddp"] or not found["at_optimizer"]["optimizer"]:
        raise RuntimeError(f"the ways did not take their paths: {found['at_optimizer']}")
    ratios = {way: [s / d for s, d in zip(steps[way], steps["ddp"])] for way in WAYS[1:]}
    return {
        "devices": devices,
        **{f"{way}_ms": 1000 * common.median(steps[way]) for way in WAYS},
        **{f"{way}_ratio": common.median(r) for way, r in ratios.items()},
        **{f"{way}_spread": [min(r), max(r)] for way, r in ratios.items()},
        "weight_difference": found["weight_difference"],
    }


def table(results):
    rows = ["| processes | ddp ms/step | optimizer ms/step | optimizer / ddp (min-max) "
            "| noise: ddp again / ddp (min-max) | weights: largest difference |",
            "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        low, high = r["optimizer_spread"]
        floor_low, floor_high = r["ddp again_spread"]
        rows.append(
            f"| {r['devices']} | {r['ddp_ms']:.1f} | {r['optimizer_ms']:.1f} "
            f"| {r['optimizer_ratio']:.3f} ({low:.3f}-{high:.3f}) "
            f"| {r['ddp again_ratio']:.3f} ({floor_low:.3f}-{floor_high:.3f}) "
            f"| {r['weight_difference']:.1e} |")
    return "\n".join(rows)


def main():
    parser = common.model_options(__doc__, devices="2,4", repeats=6)
    options = parser.parse_args()
    if options.child:
        options.devices = int(options.devices)
        print(__import__("json").dumps(child(options)))
        return 0
    if options.smoke:
        common.smoke_sizes(options)
    results = []
    for devices in map(int, options.devices.split(",")):
        result = measure(devices, options)
        if result is not None:
            results.append(result)
            print(table(results[-1:]).splitlines()[-1], flush=True)
    if not results:
        return 0
    common.write(options.out, "gradient_paths", results, table(results))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
