"""What each device holds with shard=True against replication: the bytes of
the model's weights and of its optimizer state on each device (JAX: the
addressable shards of every array; torch: each process's tensors;
TensorFlow: each device's component of every variable), the engine's peak
where it keeps one (GPUs), and the step time each way costs, for one model
(a multilayer perceptron, `--width` wide, trained with Adam: two slots per
weight) at 1, 2 and 4 devices, on every installed engine. JAX and torch
split weights and optimizer state (torch: measured after each training
step, between steps, where they are split); TensorFlow refuses shard=True (docs/sharding.md) and is measured replicated.

    python benchmarks/memory.py              # 1, 2 and 4 devices
    python benchmarks/memory.py --smoke      # seconds: checks it runs
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

sys.path.insert(0, common.ROOT)
from tests.programs.held import bytes_per_device, rank, watch  # noqa: E402

SCRIPT = os.path.abspath(__file__)
WAYS = ("replicated", "sharded")
# The engines that shard (TensorFlow refuses shard=True).
SHARDING = ("jax", "torch")


def child(options, shard):
    import keras
    import numpy as np

    import agnostic

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((options.features,))] + [
        keras.layers.Dense(options.width, activation="relu") for _ in range(3)] + [
        keras.layers.Dense(10)])
    arguments = dict(optimizer=keras.optimizers.Adam(1e-4),
                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if options.devices > 1:
        agnostic.backend_agnostic_compile(model, gpus=options.devices, shard=shard,
                                          **arguments)
        watch(model)  # torch, sharded: weights are whole again once fit returns
    else:
        model.compile(**arguments)
    rng = np.random.default_rng(0)
    x = rng.random((options.batch * options.steps, options.features), dtype="float32")
    y = rng.integers(0, 10, len(x))
    steps = common.timed_epochs(keras, {"way": model}, ["way"], x, y, options.batch,
                                options.repeats)["way"]
    if rank() == 0:  # torch: every process measured its own steps; rank 0 says
        print(json.dumps({"held": bytes_per_device(model), "peak": peak(keras),
                          "step_ms": 1000 * common.median(steps)}))


def peak(keras):
    """The most bytes the engine had in use on one of this process's
    devices, where it keeps count (GPUs; not CPUs, where None)."""
    engine = keras.backend.backend()
    if engine == "torch":
        import torch

        return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    if engine == "jax":
        import jax

        peaks = [(device.memory_stats() or {}).get("peak_bytes_in_use")
                 for device in jax.local_devices()]
        peaks = [value for value in peaks if value is not None]
        return max(peaks) if peaks else None
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return max(tf.config.experimental.get_memory_info(gpu.name)["peak"] for gpu in gpus) \
        if gpus else None


def table(results):
    rows = ["| engine | devices | way | weights MB | optimizer MB "
            "| both, of one device's | peak MB | step ms |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        whole = next(o["both"] for o in results if o["engine"] == r["engine"] and
                     o["devices"] == 1)
        rows.append(f"| {r['engine']} | {r['devices']} | {r['way']} | "
                    f"{r['weights'] / 1e6:.2f} | {r['optimizer'] / 1e6:.2f} | "
                    f"{r['both'] / whole:.3f} | {_megabytes(r.get('peak'))} | "
                    f"{r['step_ms']:.1f} |")
    return "\n".join(rows)


def _megabytes(value):
    return "n/a" if value is None else f"{value / 1e6:.2f}"


def ways(engine, devices):
    if devices == 1:
        return WAYS[:1]
    return WAYS if engine in SHARDING else WAYS[:1]


def main():
    parser = common.model_options(__doc__, devices="1,2,4", repeats=3)
    parser.add_argument("--shard", action="store_true", help=argparse_hidden())
    parser.set_defaults(batch=64, steps=10, width=1024, features=256)
    options = parser.parse_args()
    if options.child:
        options.devices = int(options.devices)
        child(options, options.shard)
        return 0
    if options.smoke:
        common.smoke_sizes(options)
        options.devices = "1,2"
    results = []
    for engine in common.installed(("jax", "torch", "tensorflow")):
        for devices in map(int, options.devices.split(",")):
            for way in ways(engine, devices):
                arguments = common.child_arguments(options, devices) + (
                    ["--shard"] if way == "sharded" else [])
                measured = common.run_child(SCRIPT, arguments, engine, devices)
                largest = max(measured["held"].values(),
                              key=lambda sizes: sizes["weights"] + sizes["optimizer"])
                results.append({"engine": engine, "devices": devices, "way": way,
                                "step_ms": measured["step_ms"], "held": measured["held"],
                                "peak": measured.get("peak"),
                                "both": largest["weights"] + largest["optimizer"],
                                **largest})
                print(table(results).splitlines()[-1], flush=True)
    common.write(options.out, "memory", results, table(results))
    print(table(results))
    return 0


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
