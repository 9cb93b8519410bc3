"""What the shim costs over hand-written native code, per engine.

For each installed engine (one process per engine and device count), the same
model trains two ways on the same (simulated) devices: through
`backend_agnostic_compile`, and through hand-written native code for the same
strategy (MirroredStrategy, DataParallel; one device: plain compile/fit). The
two alternate, after a warm-up that excludes compilation; each repeat gives
each way's median step time; the report gives the medians, their ratio and the
spread of the per-repeat ratios. Start-up (compile to the first finished step)
is timed in fresh processes, alternating too.

    python benchmarks/overhead.py                # full run, a few minutes
    python benchmarks/overhead.py --smoke        # seconds: checks it runs

A third model, a second copy of the native way, runs in the same rotation: its
ratio to the first native one is the noise floor of the measurement. torch on
several devices runs one process per device (the shim starts them); its
native counterpart is the hand-written loop of Keras's own guide to
distributed training with torch (the Keras model inside torch's
DistributedDataParallel), run in the same processes. The number of calls into
agnostic's code during each step is counted too (0 where the shim adds
nothing per step).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SCRIPT = os.path.abspath(__file__)


def build(keras, width, features):
    keras.utils.set_random_seed(0)
    inputs = keras.layers.Input((features,))
    hidden = keras.layers.Dense(width, activation="relu")(inputs)
    hidden = keras.layers.Dense(width, activation="relu")(hidden)
    outputs = keras.layers.Dense(10, activation="softmax")(hidden)
    return keras.models.Model(inputs, outputs)


def native(keras, template, devices):
    """The hand-written way for this engine and device count."""
    backend = keras.backend.backend()
    compile_args = dict(loss="sparse_categorical_crossentropy", optimizer="sgd")
    if devices == 1:
        template.compile(**compile_args)
        return template
    if backend == "torch":
        return TorchDDPLoop(keras, template)
    if backend == "tensorflow":
        import tensorflow as tf

        names = [d.name for d in tf.config.list_logical_devices("CPU")][:devices]
        strategy = tf.distribute.MirroredStrategy(
            names, cross_device_ops=tf.distribute.ReductionToOneDevice("/cpu:0"))
        scope = strategy.scope()
    else:
        distribution = keras.distribution.DataParallel(
            devices=keras.distribution.list_devices()[:devices])
        keras.distribution.set_distribution(distribution)
        scope = distribution.scope()
    with scope:
        model = keras.models.clone_model(template)
        model.set_weights(template.get_weights())
        model.compile(**compile_args)
    return model


class TorchDDPLoop:
    """Hand-written data parallelism on torch, as Keras's guide writes it:
    the model inside DistributedDataParallel, a plain loop, each process on
    its share of every global batch. Needs the process group (the shim's)."""

    def __init__(self, keras, template):
        import torch
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.parallel = torch.nn.parallel.DistributedDataParallel(template)
        self.optimizer = torch.optim.SGD(template.parameters(), lr=0.01)  # Keras's "sgd"
        self.loss = keras.losses.SparseCategoricalCrossentropy()

    def fit(self, x, y, batch_size, callbacks=(), **ignored):
        import torch

        share = batch_size // self.world
        for step in range(len(x) // batch_size):
            for callback in callbacks:
                callback.on_train_batch_begin(step)
            first = step * batch_size + self.rank * share
            inputs = torch.as_tensor(x[first:first + share])
            targets = torch.as_tensor(y[first:first + share])
            self.optimizer.zero_grad()
            loss = self.loss(targets, self.parallel(inputs))
            loss.backward()
            self.optimizer.step()
            loss.item()
            for callback in callbacks:
                callback.on_train_batch_end(step)


def shim(keras, template, devices):
    import agnostic

    return agnostic.backend_agnostic_compile(
        template, loss="sparse_categorical_crossentropy", optimizer="sgd", gpus=devices)


def child(arguments):
    import keras
    import numpy as np

    devices = arguments.devices
    x = np.random.default_rng(0).normal(size=(arguments.batch * arguments.steps,
                                              arguments.features)).astype("float32")
    y = np.random.default_rng(1).integers(0, 10, len(x))
    make = {"native": native, "shim": shim}
    if arguments.startup:
        began = time.perf_counter()
        model = make[arguments.startup](keras, build(keras, arguments.width,
                                                      arguments.features), devices)
        first = model.train_on_batch(x[:arguments.batch], y[:arguments.batch])
        return {"startup": time.perf_counter() - began, "loss": float(np.ravel(first)[0])}
    # The shim first: on torch it starts the processes the native loop uses.
    # "control" is a second native model, the noise floor.
    ways = ("shim", "native", "control")
    models = {way: make[way.replace("control", "native")](
        keras, build(keras, arguments.width, arguments.features), devices) for way in ways}
    for model in models.values():  # warm-up: tracing and compilation
        model.fit(x, y, batch_size=arguments.batch, epochs=1, verbose=0)
    steps = common.timed_epochs(keras, models, ways, x, y, arguments.batch, arguments.repeats)
    counter = common.step_call_counter(keras, os.path.dirname(agnostic_file()))
    models["shim"].fit(x, y, batch_size=arguments.batch, epochs=1, verbose=0, shuffle=False,
                       callbacks=[counter])
    steps["agnostic_calls_per_step"] = counter.per_step()
    return steps


def agnostic_file():
    import agnostic

    return agnostic.__file__


def measure(engine, devices, options):
    base = common.child_arguments(options, devices)
    steps = common.run_child(SCRIPT, base, engine, devices)
    ratios = [s / n for s, n in zip(steps["shim"], steps["native"])]
    controls = [c / n for c, n in zip(steps["control"], steps["native"])]
    startup = {"native": [], "shim": []}
    # torch on several devices: the shim's start-up includes starting the
    # processes, which hand-written code leaves to torchrun: not comparable.
    processes = engine == "torch" and devices > 1
    for _ in range(0 if processes else options.startups):
        for way in ("native", "shim"):
            startup[way].append(common.run_child(SCRIPT, base + ["--startup", way],
                                                 engine, devices)["startup"])
    return {
        "engine": engine, "devices": devices,
        "native_ms": 1000 * common.median(steps["native"]),
        "shim_ms": 1000 * common.median(steps["shim"]),
        "ratio": common.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "control": common.median(controls), "control_min": min(controls),
        "control_max": max(controls),
        "agnostic_calls_per_step": steps["agnostic_calls_per_step"],
        "startup_native_s": common.median(startup["native"]),
        "startup_shim_s": common.median(startup["shim"]),
    }


def table(results):
    # Short headers (the page's width); docs/benchmarks.md says what each is.
    rows = ["| engine | dev. | native ms | shim ms | ratio | spread | noise | calls "
            "| start native s | start shim s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        rows.append(
            f"| {r['engine']} | {r['devices']} | {r['native_ms']:.1f} | {r['shim_ms']:.1f} "
            f"| {r['ratio']:.3f} | {r['ratio_min']:.3f}-{r['ratio_max']:.3f} "
            f"| {r['control']:.3f} ({r['control_min']:.3f}-{r['control_max']:.3f}) "
            f"| {r['agnostic_calls_per_step']:g} "
            f"| {seconds(r['startup_native_s'])} | {seconds(r['startup_shim_s'])} |")
    return "\n".join(rows)


def seconds(value):
    return "n/a" if value != value else f"{value:.2f}"  # NaN: not measured


def chart(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r['engine']}\n{r['devices']} dev" for r in results]
    figure, axis = plt.subplots(figsize=(max(6, len(results)), 3.5))
    axis.bar(labels, [r["ratio"] for r in results], color="#4c72b0")
    axis.errorbar(labels, [r["ratio"] for r in results],
                  yerr=[[r["ratio"] - r["ratio_min"] for r in results],
                        [r["ratio_max"] - r["ratio"] for r in results]], fmt="none", color="k")
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.axhline(1.02, color="red", linestyle="--", linewidth=0.8, label="target 1.02")
    axis.set_ylabel("shim / native step time")
    axis.set_ylim(0.8, 1.2)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return True


def main():
    parser = common.model_options(__doc__, devices="1,2,4", repeats=5)
    parser.add_argument("--startup", choices=["native", "shim"], help=argparse.SUPPRESS)
    parser.add_argument("--engines", default=",".join(common.ENGINES))
    parser.add_argument("--startups", type=int, default=3)
    options = parser.parse_args()
    if options.child:
        options.devices = int(options.devices)
        print(__import__("json").dumps(child(options)))
        return 0
    if options.smoke:
        common.smoke_sizes(options)
        options.startups = 1
    results = []
    for engine in common.installed(options.engines.split(",")):
        for devices in map(int, options.devices.split(",")):
            results.append(measure(engine, devices, options))
            print(table(results[-1:]).splitlines()[-1], flush=True)
    common.write(options.out, "overhead", results, table(results))
    chart(results, os.path.join(options.out, "overhead.png"))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
