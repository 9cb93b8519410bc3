"""What batch statistics over the global batch cost: a convolutional
network with batch normalization after every convolution, trained through
agnostic on several devices with `sync_batch_norm=True` (the default: every
layer's statistics all-reduced each step) and `False` (each replica's own),
alternating in the same process after a warm-up. TensorFlow and torch (JAX
always normalises over the global batch, in one program).

    python benchmarks/batch_norm.py              # 2 devices
    python benchmarks/batch_norm.py --smoke      # seconds: checks it runs
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SCRIPT = os.path.abspath(__file__)
WAYS = ("synchronised", "per_replica")
ENGINES = ("tensorflow", "torch")
IMAGE = (32, 32, 3)
CLASSES = 10


def build(keras, width, blocks):
    layers = [keras.Input(IMAGE)]
    for _ in range(blocks):
        layers += [keras.layers.Conv2D(width, 3, padding="same", use_bias=False),
                   keras.layers.BatchNormalization(), keras.layers.Activation("relu")]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(CLASSES)]
    return keras.Sequential(layers)


def child(options):
    timed(options, WAYS, lambda way: {"sync_batch_norm": way == "synchronised"})


def timed(options, ways, keywords):
    """Prints (the chief) each of `ways`' step times in ms, the model
    compiled with `keywords(way)` for each, trained in rotation."""
    import keras
    import numpy as np

    import agnostic

    blocks = 2 if options.smoke_child else 6
    x = np.random.default_rng(0).normal(
        size=(options.batch * options.steps,) + IMAGE).astype("float32")
    y = np.random.default_rng(1).integers(0, CLASSES, len(x))
    models = {}
    for way in ways:
        keras.utils.set_random_seed(0)
        models[way] = agnostic.backend_agnostic_compile(
            build(keras, options.width, blocks), optimizer="sgd", gpus=options.devices,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            **keywords(way))
        models[way].fit(x, y, batch_size=options.batch, epochs=1, verbose=0,
                        shuffle=False)  # warm-up: compilation, first steps
    seconds = common.timed_epochs(keras, models, ways, x, y, options.batch, options.repeats,
                                  first_step=True)
    result = {way: [1000 * value for value in values] for way, values in seconds.items()}
    if agnostic.resolve(gpus=options.devices).process_id == 0:
        print(json.dumps(result))


def main():
    return common.two_ways_main(__doc__, SCRIPT, "batch_norm", WAYS,
                                ("synchronised", "per-replica"), child, ENGINES)


if __name__ == "__main__":
    sys.exit(main())
