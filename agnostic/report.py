"""`agnostic info`: the environment report a bug report needs, gathered
without importing an engine here.

Each installed engine is asked in a process of its own, all at once (its
start-up lines discarded): its version, whether it sees a GPU, the CUDA and
cuDNN it was built with. The engine Keras runs on is asked by the process
that also resolves the plan, so that it is imported once. The machine's GPUs
come from `nvidia-smi` where it exists.
"""
import concurrent.futures
import json
import os
import platform
import shutil
import subprocess
import sys

# What each engine is asked, in a process of its own: a JSON line.
PROBES = {
    "tensorflow": (
        "import tensorflow as tf; b = tf.sysconfig.get_build_info(); "
        "g = tf.config.list_physical_devices('GPU'); "
        "r = dict(version=tf.__version__, gpus=len(g), cuda=b.get('cuda_version'), "
        "cudnn=b.get('cudnn_version'), built_with_cuda=tf.test.is_built_with_cuda())"),
    "jax": (
        "import jax; d = jax.devices(); "
        "r = dict(version=jax.__version__, platform=d[0].platform, "
        "gpus=sum(x.platform == 'gpu' for x in d))"),
    "torch": (
        "import torch; c = torch.cuda.is_available(); "
        "r = dict(version=torch.__version__, gpus=torch.cuda.device_count() if c else 0, "
        "cuda=torch.version.cuda, "
        "cudnn=torch.backends.cudnn.version() if c else None, "
        "gpu_names=[torch.cuda.get_device_name(i) for i in "
        "range(torch.cuda.device_count())] if c else [])"),
    "mxnet": (
        "import mxnet as mx; "
        "r = dict(version=mx.__version__, gpus=mx.context.num_gpus())"),
}
# Variables that change what agnostic or the engines do: shown when set.
VARIABLES = ("KERAS_BACKEND", "KERAS_HOME", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
             "MKL_NUM_THREADS", "XLA_FLAGS", "TF_CONFIG", "RANK", "WORLD_SIZE",
             "LOCAL_RANK", "SLURM_JOB_ID", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
PROBE_SECONDS = 60
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore", "GRPC_VERBOSITY": "ERROR"}


def gather():
    """The whole report, as a dict (JSON-ready)."""
    from agnostic import __version__, devices
    from agnostic.compat import versions

    engine, source = devices.backend_source()
    report = {
        "agnostic": __version__,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "os": platform.platform(),
        "cpus": os.cpu_count(),
        "usable_cores": devices.cores(),
        "memory_gb": _memory_gb(),
        "nvidia_smi": _nvidia_smi(),
        "engine": {"name": engine, "source": source},
        "keras": versions.describe(installed("keras"), devices.configured_backend()),
        "variables": {name: os.environ[name] for name in VARIABLES if name in os.environ},
    }
    report["variables"].update((k, v) for k, v in sorted(os.environ.items())
                               if k.startswith("AGNOSTIC_"))
    report["engines"], report["plan"] = _ask_engines(engine)
    clash = _other_agnostic()
    if clash:
        report["conflict"] = (
            f"the distribution 'agnostic' {clash} (Agnostic Database Migrations, an "
            "unrelated project) is installed here too: it writes the same import package "
            "and command as keras-agnostic. Uninstall it (`pip uninstall agnostic`), then "
            "reinstall keras-agnostic.")
    return report


def installed(name):
    """The installed version of an engine (its distributions' names), or None."""
    from importlib import metadata

    for distribution in DISTRIBUTIONS.get(name, (name,)):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


# The distributions each engine may come from, in the order asked.
DISTRIBUTIONS = {"keras": ("keras", "keras-nightly", "keras-mxnet"),
                 "tensorflow": ("tensorflow", "tensorflow-cpu")}


def _ask_engines(configured):
    """({engine: its answers}, the plan's answers), asked all at once."""
    engines = {name: {"version": installed(name)} for name in PROBES}
    asks = {name: [sys.executable, "-c", _probe_program(name)]
            for name in PROBES if engines[name]["version"] and name != configured}
    asks["plan"] = [sys.executable, "-m", "agnostic.report", "--plan"]
    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
        answers = dict(zip(asks, pool.map(_ask, asks.values())))
    plan = answers.pop("plan")
    for name, answer in answers.items():
        engines[name].update(answer)
    if configured in engines and "engine" in plan:
        engines[configured].update(plan.pop("engine"))
    return engines, plan


def _other_agnostic():
    """The version of the registry's other "agnostic" distribution, if installed
    (this project was built under that name before it became keras-agnostic)."""
    from importlib import metadata

    try:
        found = metadata.metadata("agnostic")
    except metadata.PackageNotFoundError:
        return None
    return None if "Keras" in (found["Summary"] or "") else found["Version"]


def _probe_program(name):
    return f"import json\n{PROBES[name]}\nprint(json.dumps(r))"


def _ask(command):
    """Runs `command` quietly; its last JSON line, or {"error": why}."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_SECONDS,
                              env=dict(os.environ, **QUIET), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {PROBE_SECONDS} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit status {done.returncode}: {last}"}
    return json.loads(lines[-1])


def _plan():
    """In the process that asks Keras's engine: the plan, and the engine's answers."""
    from agnostic import devices, errors, plan
    from agnostic.plan import placement

    answers = {}
    try:
        chosen = plan.resolve()
    except errors.AgnosticError as error:
        # An engine that is missing or named wrong is what info is run to
        # find out: said, with the advice, and not a failure of info's.
        return {"unavailable": str(error),
                "engine_missing": isinstance(error, errors.EngineUnavailableError)}
    answers.update(
        backend=chosen.backend, environment=chosen.environment, strategy=chosen.strategy,
        replicas=chosen.num_replicas, processes=chosen.num_processes,
        process_id=chosen.process_id, devices=list(chosen.devices), reason=chosen.reason,
        threads=chosen.threads_reason or None, warning=chosen.fallback_warning,
        placements=placement.describe(chosen.backend, devices.list_devices(chosen.backend)),
        shard=_shard(plan, chosen))
    if chosen.backend in PROBES:
        namespace = {}
        try:
            exec(PROBES[chosen.backend], namespace)  # the engine is imported already
            answers["engine"] = namespace["r"]
        except Exception as error:  # noqa: BLE001 - said in the report
            answers["engine"] = {"error": f"{type(error).__name__}: {error}"}
    return answers


def _shard(plan, chosen):
    """What shard=True would split with this plan, or why it is refused."""
    from agnostic import errors
    from agnostic.plan import shards

    try:
        split = shards.sharded(chosen)
    except errors.NotSupportedError:
        return (f"refused: {chosen.strategy} on {chosen.backend}, where "
                f"{shards.unsplittable(chosen)}")
    if split is chosen:
        return "nothing to split on one device"
    split_text = shards.SPLIT[split.strategy].format(n=split.num_replicas)
    return f"strategy {split.strategy}: {split_text}"


def _memory_gb():
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _nvidia_smi():
    """[{name, memory, driver}] of each NVIDIA GPU, or why there is none."""
    if shutil.which("nvidia-smi") is None:
        return "not found (no NVIDIA driver on this machine, or not on PATH)"
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"failed: {error}"
    if done.returncode != 0:
        return f"failed: {(done.stderr or done.stdout).strip()[:300]}"
    gpus = []
    for line in done.stdout.strip().splitlines():
        name, memory, driver = (part.strip() for part in line.split(",")[:3])
        gpus.append({"name": name, "memory": memory, "driver": driver})
    return gpus


def text(report):
    """The report as lines to paste."""
    lines = [f"agnostic: {report['agnostic']} (distribution keras-agnostic)", f"python: {report['python']} "
             f"({report['executable']})", f"os: {report['os']}",
             f"cpus: {report['cpus']} ({report['usable_cores']} usable by this process); "
             f"memory: {report['memory_gb']} GB"]
    smi = report["nvidia_smi"]
    if isinstance(smi, list):
        lines.append(f"nvidia gpus: {len(smi)}" + "".join(
            f"\n  {i}: {g['name']}, {g['memory']}, driver {g['driver']}"
            for i, g in enumerate(smi)))
    else:
        lines.append(f"nvidia gpus: {smi}")
    if report.get("conflict"):
        lines.append(f"conflict: {report['conflict']}")
    engine = report["engine"]
    lines.append(f"engine: {engine['name']} ({engine['source']}; switch with "
                 "KERAS_BACKEND=...)")
    lines.append(f"keras: {report['keras']}")
    for name, answer in report["engines"].items():
        lines.append(f"{name}: {_engine_line(answer)}")
    for name, value in report["variables"].items():
        lines.append(f"variable: {name}={value}")
    plan = report["plan"]
    if "unavailable" in plan:
        lines.append(f"plan: unavailable: {plan['unavailable']}")
        return "\n".join(lines)
    if "error" in plan:
        lines.append(f"plan: unavailable: {plan['error']}")
        return "\n".join(lines)
    lines += [f"backend: {plan['backend']}", f"environment: {plan['environment']}",
              f"plan: strategy={plan['strategy']} replicas={plan['replicas']} "
              f"processes={plan['processes']} process_id={plan['process_id']} "
              f"devices=[{', '.join(plan['devices'])}]"]
    if plan.get("threads"):
        lines.append(f"threads: {plan['threads']}")
    lines.append(f"reason: {plan['reason']}")
    if plan.get("warning"):  # what backend_agnostic_compile would warn
        lines.append(f"warning: {plan['warning']}")
    lines.append(f"placements: {plan['placements']}")
    if plan.get("shard"):
        lines.append(f"shard=True: {plan['shard']}")
    return "\n".join(lines)


def _engine_line(answer):
    if not answer.get("version"):
        return "not installed"
    if "error" in answer:
        return f"{answer['version']} (could not be asked: {answer['error']})"
    seen = [f"sees {answer.get('gpus', 0)} GPU(s)"]
    if answer.get("platform"):
        seen.append(f"platform {answer['platform']}")
    if answer.get("gpu_names"):
        seen.append(", ".join(answer["gpu_names"]))
    for key, label in (("cuda", "CUDA"), ("cudnn", "cuDNN")):
        if answer.get(key):
            seen.append(f"built with {label} {answer[key]}")
    if answer.get("built_with_cuda") is False or ("cuda" in answer and not answer["cuda"]):
        seen.append("a CPU build")
    return f"{answer['version']} ({'; '.join(seen)})"


def succeeded(report):
    """Whether info's exit status is 0: a plan, or an engine missing (the
    report names it, with what to install or set); not a bad setting."""
    plan = report["plan"]
    if "error" in plan:
        return False
    return "unavailable" not in plan or bool(plan.get("engine_missing"))


if __name__ == "__main__" and sys.argv[1:] == ["--plan"]:
    print(json.dumps(_plan()))
