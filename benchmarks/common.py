"""What both benchmarks share: running one engine per child process, timing
steps with a callback, and writing JSON and Markdown."""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINES = ("tensorflow", "jax", "torch")


def model_options(doc, devices, repeats):
    """The command line of the benchmarks that train overhead.py's model."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--devices", default=devices)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it runs")
    return parser


def smoke_sizes(options):
    """Seconds instead of minutes: checks that a benchmark runs, times nothing."""
    options.batch, options.steps, options.repeats = 8, 3, 2
    options.width, options.features, options.devices = 16, 8, "2"
    options.out = os.path.join(options.out, "smoke")


def child_arguments(options, devices):
    """What a child process needs of `options` (see model_options)."""
    return ["--devices", str(devices), "--batch", str(options.batch), "--steps",
            str(options.steps), "--repeats", str(options.repeats), "--width",
            str(options.width), "--features", str(options.features)]


def installed(engines):
    return [e for e in engines if importlib.util.find_spec(e) is not None]


def run_child(script, arguments, engine, devices, timeout=3600):
    """Runs `script --child ...` with one engine; returns its last JSON line."""
    env = dict(os.environ, KERAS_BACKEND=engine, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("AGNOSTIC_CPU_DEVICES", None)
    if devices > 1:
        env["AGNOSTIC_CPU_DEVICES"] = str(devices)
    result = subprocess.run([sys.executable, script, "--child"] + arguments, env=env,
                            capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{engine} on {devices} device(s) failed:\n{result.stderr[-4000:]}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def two_ways_main(doc, script, name, ways, names, child, engines, note=None):
    """The command line of a benchmark of two `ways` of training one model
    (batch_norm.py, global_view.py): as a child, `child(options)` measures
    them; else one child per installed engine and device count, the table
    (`names`: each way's column) written to `name`.json and .md; `note(options)`
    adds to each result and prints a line."""
    parser = model_options(doc, devices="2", repeats=7)
    parser.add_argument("--smoke-child", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(batch=64, steps=10, width=32)
    options = parser.parse_args()
    if options.child:
        options.devices = int(options.devices)
        child(options)
        return 0
    extra = []
    if options.smoke:
        smoke_sizes(options)
        options.width, extra = 4, ["--smoke-child"]
    results = []
    for result in two_ways(script, options, ways, engines, extra):
        result.update(note(options) if note else {})
        results.append(result)
        print(two_ways_table(results[-1:], ways, names).splitlines()[-1], flush=True)
    write(options.out, name, results, two_ways_table(results, ways, names))
    print(two_ways_table(results, ways, names))
    for key, value in (note(options) if note else {}).items():
        print(f"{key}: {value}")
    return 0


def two_ways(script, options, ways, engines, extra=()):
    """Each installed engine's and device count's step times of the two
    `ways` (a child process each, trained in rotation there): their
    medians in ms and the ratios first/second, repeat by repeat; each
    result is yielded as it comes."""
    first, second = ways
    for engine in installed(engines):
        for devices in map(int, options.devices.split(",")):
            measured = run_child(script, child_arguments(options, devices) + list(extra),
                                 engine, devices)
            ratios = [a / b for a, b in zip(measured[first], measured[second])]
            yield {"engine": engine, "devices": devices, "ratios": ratios,
                   "ratio": median(ratios),
                   f"{first}_ms": median(measured[first]),
                   f"{second}_ms": median(measured[second]),
                   f"{first}_each": measured[first], f"{second}_each": measured[second]}


def two_ways_table(results, ways, names):
    """A Markdown table of `two_ways` results; `names`: each way's column."""
    first, second = ways
    rows = [f"| engine | devices | {names[0]} ms/step | {names[1]} ms/step | ratio "
            "(median of repeats) | spread (min-max) |", "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        rows.append(f"| {r['engine']} | {r['devices']} | {r[first + '_ms']:.1f} | "
                    f"{r[second + '_ms']:.1f} | {r['ratio']:.3f} | "
                    f"{min(r['ratios']):.3f}-{max(r['ratios']):.3f} |")
    return "\n".join(rows)


def step_timer(keras):
    """A callback that records each training step's wall time."""

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_train_batch_begin(self, batch, logs=None):
            self._began = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.seconds.append(time.perf_counter() - self._began)

    return StepTimer()


def step_call_counter(keras, package_folder):
    """A callback that counts calls into `package_folder`'s code during steps."""

    class CallCounter(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls, self.steps = 0, 0

        def count(self, frame, event, argument):
            if event == "call" and frame.f_code.co_filename.startswith(package_folder):
                self.calls += 1

        def on_train_batch_begin(self, batch, logs=None):
            sys.setprofile(self.count)

        def on_train_batch_end(self, batch, logs=None):
            sys.setprofile(None)
            self.steps += 1

        def per_step(self):
            return self.calls / max(self.steps, 1)

    return CallCounter()


def timed_epochs(keras, models, ways, x, y, batch, repeats, first_step=False, shuffle=False):
    """Each way's median step time in seconds, one per repeat: an epoch of
    `models[way].fit` per way and repeat, in rotated order (`rotations`).
    Each epoch's first step is left out unless `first_step` (or it is the
    only one)."""
    steps = {way: [] for way in ways}
    for order in rotations(tuple(ways), repeats):
        for way in order:
            timer = step_timer(keras)
            models[way].fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=shuffle,
                            callbacks=[timer])
            seconds = timer.seconds if first_step else (timer.seconds[1:] or timer.seconds)
            steps[way].append(median(seconds))
    return steps


def rotations(ways, repeats):
    """Each repeat's order of `ways`, rotated so that going first favours none."""
    for repeat in range(repeats):
        shift = repeat % len(ways)
        yield ways[shift:] + ways[:shift]


def median(values):
    return statistics.median(values) if values else float("nan")


def machine():
    import platform

    return {"python": platform.python_version(), "processor": platform.processor()
            or platform.machine(), "cpus": os.cpu_count(), "system": platform.platform(),
            "gpus": _gpus()}


def _gpus():
    """The NVIDIA GPUs as `agnostic info` lists them (nvidia-smi), or why none."""
    sys.path.insert(0, ROOT)
    from agnostic import report

    return report._nvidia_smi()


def write(folder, name, results, table):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name + ".json"), "w") as handle:
        json.dump({"machine": machine(), "results": results}, handle, indent=1)
    with open(os.path.join(folder, name + ".md"), "w") as handle:
        handle.write(table + "\n")
