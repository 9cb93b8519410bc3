"""What batch statistics over the global batch cost: a convolutional
network with batch normalization after every convolution, trained through
agnostic on several devices with `sync_batch_norm=True` (the default: every
layer's statistics all-reduced each step) and `False` (each replica's own),
alternating in the same process after a warm-up. TensorFlow and torch (JAX
always normalises over the global batch, in one program).

    python benchmarks/batch_norm.py              # 2 devices
    python benchmarks/batch_norm.py --smoke      # seconds: checks it runs
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SCRIPT = os.path.abspath(__file__)
WAYS = ("synchronised", "per_replica")
ENGINES = ("tensorflow", "torch")


def build(keras, width, blocks):
    layers = [keras.Input((32, 32, 3))]
    for _ in range(blocks):
        layers += [keras.layers.Conv2D(width, 3, padding="same", use_bias=False),
                   keras.layers.BatchNormalization(), keras.layers.Activation("relu")]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    return keras.Sequential(layers)


def child(options):
    import keras
    import numpy as np

    import agnostic

    blocks = 2 if options.smoke_child else 6
    x = np.random.default_rng(0).normal(
        size=(options.batch * options.steps, 32, 32, 3)).astype("float32")
    y = np.random.default_rng(1).integers(0, 10, len(x))
    models = {}
    for way in WAYS:
        keras.utils.set_random_seed(0)
        models[way] = agnostic.backend_agnostic_compile(
            build(keras, options.width, blocks), optimizer="sgd", gpus=options.devices,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            sync_batch_norm=way == "synchronised")
        models[way].fit(x, y, batch_size=options.batch, epochs=1, verbose=0,
                        shuffle=False)  # warm-up: compilation, first steps
    seconds = common.timed_epochs(keras, models, WAYS, x, y, options.batch, options.repeats,
                                  first_step=True)
    result = {way: [1000 * value for value in values] for way, values in seconds.items()}
    if agnostic.resolve(gpus=options.devices).process_id == 0:
        print(json.dumps(result))


def table(results):
    rows = ["| engine | devices | synchronised ms/step | per-replica ms/step | ratio "
            "(median of repeats) | spread (min-max) |", "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        rows.append(f"| {r['engine']} | {r['devices']} | {r['synchronised_ms']:.1f} | "
                    f"{r['per_replica_ms']:.1f} | {r['ratio']:.3f} | "
                    f"{min(r['ratios']):.3f}-{max(r['ratios']):.3f} |")
    return "\n".join(rows)


def main():
    parser = common.model_options(__doc__, devices="2", repeats=7)
    parser.add_argument("--smoke-child", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(batch=64, steps=10, width=32)
    options = parser.parse_args()
    if options.child:
        options.devices = int(options.devices)
        child(options)
        return 0
    extra = []
    if options.smoke:
        common.smoke_sizes(options)
        options.width, extra = 4, ["--smoke-child"]
    results = []
    for engine in common.installed(ENGINES):
        for devices in map(int, options.devices.split(",")):
            arguments = common.child_arguments(options, devices) + extra
            measured = common.run_child(SCRIPT, arguments, engine, devices)
            ratios = [s / p for s, p in zip(measured["synchronised"], measured["per_replica"])]
            results.append({
                "engine": engine, "devices": devices, "ratios": ratios,
                "ratio": common.median(ratios),
                "synchronised_ms": common.median(measured["synchronised"]),
                "per_replica_ms": common.median(measured["per_replica"]),
                "synchronised_each": measured["synchronised"],
                "per_replica_each": measured["per_replica"],
            })
            print(table(results[-1:]).splitlines()[-1], flush=True)
    common.write(options.out, "batch_norm", results, table(results))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
