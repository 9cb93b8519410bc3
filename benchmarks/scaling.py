"""How training throughput scales with devices, per engine and strategy.

A ResNet-50 from keras.applications (random weights, synthetic images) trains
on 1, 2, 4 and 8 devices through `backend_agnostic_compile`; the report gives
images/s and scaling efficiency (images/s on N devices over N times images/s
on one). Each engine and device count runs in its own process; torch-ddp
starts its own processes. Variants: tf-mirrored with and without CPU merge,
jax-data-parallel, torch-ddp.

    python benchmarks/scaling.py                 # on a machine with GPUs
    python benchmarks/scaling.py --tiny          # on CPU, simulated devices
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SCRIPT = os.path.abspath(__file__)
VARIANTS = (("tensorflow", "cpu_merge"), ("tensorflow", "engine_reduce"),
            ("jax", "data_parallel"), ("torch", "ddp"))


def child(options):
    import keras
    import numpy as np

    import agnostic

    size = options.image
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3),
                                        classes=options.classes)
    batch = options.per_device * options.devices
    x = np.random.default_rng(0).normal(size=(batch * options.steps, size, size, 3))
    x = x.astype("float32")
    y = np.random.default_rng(1).integers(0, options.classes, len(x))
    parallel = agnostic.backend_agnostic_compile(
        model, loss="sparse_categorical_crossentropy", optimizer="sgd",
        gpus=options.devices, cpu_merge=options.variant != "engine_reduce")
    parallel.fit(x[:batch * 2], y[:batch * 2], batch_size=batch, epochs=1, verbose=0)
    timer = common.step_timer(keras)
    began = time.perf_counter()
    parallel.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=[timer])
    elapsed = time.perf_counter() - began
    step = common.median(timer.seconds[1:] or timer.seconds)
    if agnostic.resolve(gpus=options.devices).process_id == 0:
        print(json.dumps({"images_per_second": batch / step, "epoch_seconds": elapsed}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--devices", default="1,2,4,8")
    parser.add_argument("--engines", default=",".join(common.ENGINES))
    parser.add_argument("--per-device", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--simulate", action="store_true",
                        help="split the CPU into the devices (no accelerators)")
    parser.add_argument("--tiny", action="store_true",
                        help="CPU: 32x32 images, 2 per device, 1 and 2 simulated devices")
    parser.add_argument("--out", default=os.path.join(common.ROOT, "benchmarks", "results"))
    options = parser.parse_args()
    if options.child:
        options.devices = int(options.devices)
        child(options)
        return 0
    if options.tiny:
        options.devices, options.per_device, options.steps = "1,2", 2, 3
        options.image, options.classes, options.simulate = 32, 10, True
        options.out = os.path.join(options.out, "tiny")
    results = []
    engines = common.installed(options.engines.split(","))
    for engine, variant in VARIANTS:
        if engine not in engines:
            continue
        for devices in map(int, options.devices.split(",")):
            arguments = ["--variant", variant, "--devices", str(devices), "--per-device",
                         str(options.per_device), "--steps", str(options.steps), "--image",
                         str(options.image), "--classes", str(options.classes)]
            try:
                measured = common.run_child(SCRIPT, arguments, engine,
                                            devices if options.simulate else 1)
            except RuntimeError as error:
                print(f"skipped {engine} {variant} on {devices}: {str(error)[-300:]}")
                continue
            results.append(dict(engine=engine, variant=variant, devices=devices, **measured))
    for result in results:
        one = next(r for r in results if (r["engine"], r["variant"], r["devices"])
                   == (result["engine"], result["variant"], 1))
        result["efficiency"] = result["images_per_second"] / (result["devices"]
                                                               * one["images_per_second"])
    rows = ["| engine | strategy | devices | images/s | efficiency |",
            "| --- | --- | --- | --- | --- |"]
    rows += [f"| {r['engine']} | {r['variant']} | {r['devices']} | "
             f"{r['images_per_second']:.1f} | {r['efficiency']:.2f} |" for r in results]
    common.write(options.out, "scaling", results, "\n".join(rows))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
