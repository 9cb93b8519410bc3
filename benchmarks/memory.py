"""What each device holds with shard=True against replication: the bytes of
the model's weights and optimizer state on each device (JAX: the addressable
shards of every array), and the step time each way costs, for one model
(a multilayer perceptron, `--width` wide, trained with Adam: two slots per
weight) at 1, 2 and 4 devices. JAX alone: the other engines refuse
shard=True (docs/sharding.md), and hold the whole model on every device.

    python benchmarks/memory.py              # 1, 2 and 4 devices
    python benchmarks/memory.py --smoke      # seconds: checks it runs
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SCRIPT = os.path.abspath(__file__)
WAYS = ("replicated", "sharded")


def child(options, shard):
    import keras
    import numpy as np

    sys.path.insert(0, common.ROOT)
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
    else:
        model.compile(**arguments)
    rng = np.random.default_rng(0)
    x = rng.random((options.batch * options.steps, options.features), dtype="float32")
    y = rng.integers(0, 10, len(x))
    steps = common.timed_epochs(keras, {"way": model}, ["way"], x, y, options.batch,
                                options.repeats)["way"]
    held = {}
    for variable in list(model.variables) + list(model.optimizer.variables):
        for shard_ in variable.value.addressable_shards:
            held[str(shard_.device)] = held.get(str(shard_.device), 0) + shard_.data.nbytes
    print(json.dumps({"held": held, "step_ms": 1000 * common.median(steps)}))


def table(results):
    rows = ["| devices | way | weights and optimizer state per device (MB, largest) | "
            "of the whole | step ms |", "| --- | --- | --- | --- | --- |"]
    whole = max(r["largest"] for r in results if r["devices"] == 1)
    for r in results:
        rows.append(f"| {r['devices']} | {r['way']} | {r['largest'] / 1e6:.2f} | "
                    f"{r['largest'] / whole:.3f} | {r['step_ms']:.1f} |")
    return "\n".join(rows)


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
    for devices in map(int, options.devices.split(",")):
        for way in WAYS if devices > 1 else WAYS[:1]:
            arguments = common.child_arguments(options, devices) + (
                ["--shard"] if way == "sharded" else [])
            measured = common.run_child(SCRIPT, arguments, "jax", devices)
            results.append({"engine": "jax", "devices": devices, "way": way,
                            "largest": max(measured["held"].values()), **measured})
            print(table(results).splitlines()[-1], flush=True)
    common.write(options.out, "memory", results, table(results))
    print(table(results))
    return 0


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
