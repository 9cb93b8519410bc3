"""Device parallelism: a two-branch model with each branch on its own device
(agnostic.device), against the same model on one device.

For each installed engine (one process each, 2 devices): two towers of
Dense layers (one per input) and a head that merges them. Three ways train
in rotation after a warm-up that excludes compilation: the unplaced model
with plain compile on one device, the placed model through
backend_agnostic_compile (tower a on device 0, tower b on device 1, the head
on the CPU), and the unplaced model a second time, whose ratio to the first
is the noise floor. The report gives the median step times and ratios.

    python benchmarks/device_parallel.py              # full run, minutes
    python benchmarks/device_parallel.py --smoke      # seconds: checks it runs

On simulated CPU devices the two devices share the same cores, so this
measures what placing costs, not a speed-up; on GPUs the towers run side by
side.
"""
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SCRIPT = os.path.abspath(__file__)
WAYS = ("one device", "placed", "one device again")


def build(keras, place, width, features):
    keras.utils.set_random_seed(0)
    input_a, input_b = keras.Input((features,)), keras.Input((features,))
    towers = []
    for device_id, inputs in ((0, input_a), (1, input_b)):
        with place(device_id):
            hidden = keras.layers.Dense(width, activation="relu")(inputs)
            towers.append(keras.layers.Dense(width, activation="relu")(hidden))
    with place("cpu"):
        merged = keras.layers.concatenate(towers)
        outputs = keras.layers.Dense(10, activation="softmax")(merged)
    return keras.Model([input_a, input_b], outputs)


def child(options):
    import keras
    import numpy as np

    import agnostic

    def unplaced(device_id):
        return contextlib.nullcontext()

    compile_kwargs = dict(loss="sparse_categorical_crossentropy")
    models = {}
    for way in WAYS:
        if way == "placed":
            template = build(keras, agnostic.device, options.width, options.features)
            models[way] = agnostic.backend_agnostic_compile(
                template, optimizer=keras.optimizers.SGD(0.01), **compile_kwargs)
        else:
            model = build(keras, unplaced, options.width, options.features)
            model.compile(optimizer=keras.optimizers.SGD(0.01), **compile_kwargs)
            models[way] = model
    rng = np.random.default_rng(0)
    samples = options.batch * options.steps
    x = [rng.random((samples, options.features), dtype="float32") for _ in range(2)]
    y = rng.integers(0, 10, samples)
    for model in models.values():  # warm-up: compilation is not timed
        model.fit(x, y, batch_size=options.batch, epochs=1, steps_per_epoch=2, verbose=0)
    steps = common.timed_epochs(keras, models, WAYS, x, y, options.batch, options.repeats,
                                shuffle=True)
    one, placed, again = (steps[way] for way in WAYS)
    print(common.json.dumps({
        "one_ms": 1000 * common.median(one), "placed_ms": 1000 * common.median(placed),
        "ratio": common.median([p / o for p, o in zip(placed, one)]),
        "spread": [min(p / o for p, o in zip(placed, one)),
                   max(p / o for p, o in zip(placed, one))],
        "noise": common.median([a / o for a, o in zip(again, one)]),
        "strategy": agnostic.resolve(model=build(keras, agnostic.device, 4, 4)).strategy,
    }))


def main():
    parser = common.model_options(__doc__, "2", repeats=5)
    parser.add_argument("--engines", default=",".join(common.ENGINES))
    options = parser.parse_args()
    if options.smoke:
        common.smoke_sizes(options)
    if options.child:
        return child(options)
    rows, results = [], {}
    for engine in common.installed(options.engines.split(",")):
        result = common.run_child(SCRIPT, common.child_arguments(options, 2), engine, 2)
        results[engine] = result
        rows.append(f"| {engine} | {result['strategy']} | {result['one_ms']:.1f} | "
                    f"{result['placed_ms']:.1f} | {result['ratio']:.3f} | "
                    f"{result['spread'][0]:.3f}-{result['spread'][1]:.3f} | "
                    f"{result['noise']:.3f} |")
    table = "\n".join([
        "| engine | strategy | one device ms/step | placed on 2 ms/step | placed / one "
        "| spread (min-max) | noise: one / one |",
        "| --- | --- | --- | --- | --- | --- | --- |"] + rows)
    common.write(options.out, "device_parallel", results, table)
    print(table)


if __name__ == "__main__":
    main()
