"""Which engine Keras runs on, and which devices that engine sees.

Each engine's lister imports the engine; nothing here runs at import time.
"""
import dataclasses
import importlib
import importlib.util
import json
import os
import sys
from typing import Sequence, Tuple

from agnostic import errors

CPU_DEVICES_VARIABLE = "AGNOSTIC_CPU_DEVICES"


@dataclasses.dataclass(frozen=True)
class DeviceListing:
    """The devices one engine can train on, in id order."""

    devices: Tuple[str, ...]
    host: str
    accelerators: bool
    simulated: bool = False
    # Engines whose one runtime spans several processes (JAX) say so here.
    num_processes: int = 1
    process_id: int = 0


def requested_cpu_devices(environ=None, warn=False):
    """The N of AGNOSTIC_CPU_DEVICES=N, or 0 when it is unset. `warn`: say
    (once) when N is far more than this process's cores (PAST_CORES times)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(CPU_DEVICES_VARIABLE, "").strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 1:
        raise errors.DeviceRequestError(
            f"{CPU_DEVICES_VARIABLE} must be a whole number of CPU devices, "
            f"1 or more, such as {CPU_DEVICES_VARIABLE}=4. Received: "
            f"{CPU_DEVICES_VARIABLE}={raw!r}"
        )
    limit = cpu_devices_limit()
    if value > limit:
        raise errors.DeviceRequestError(
            f"{CPU_DEVICES_VARIABLE}={raw} asks for more simulated CPU devices than this "
            f"machine can run: at most {limit} ({LIMIT_PER_CORE} per core on {cores()} "
            "core(s), and never fewer than "
            f"{LIMIT_FLOOR}). Each is a thread of the engine (TensorFlow, JAX) or a whole "
            f"process (torch). Ask for fewer, such as {CPU_DEVICES_VARIABLE}="
            f"{min(limit, 2 * cores())}."
        )
    if warn:
        _warn_past_cores(value)
    return value


# Simulated devices beyond these are refused: a typo (100000) would start
# that many torch processes, and JAX did not return from planning them.
LIMIT_PER_CORE = 16
LIMIT_FLOOR = 64


def cpu_devices_limit():
    """The most simulated CPU devices AGNOSTIC_CPU_DEVICES may ask for here."""
    return max(LIMIT_FLOOR, LIMIT_PER_CORE * cores())


_WARNED = set()
# A few devices per core is the usual test of a many-device program on a
# small machine (this project's CI runs 4 on 2 cores); past this many per
# core the cost is said.
PAST_CORES = 4


def cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# The variables by which a user chooses the engines' intra-op thread counts.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")


def chosen_threads(environ=None):
    """The user's own thread setting ("OMP_NUM_THREADS=4"), or None."""
    environ = os.environ if environ is None else environ
    for name in THREAD_VARIABLES:
        if environ.get(name, "").strip():
            return f"{name}={environ[name].strip()}"
    return None


def pinned():
    """Whether this process may use only some of the machine's cores (a
    scheduler's share: srun --cpus-per-task with binding, taskset)."""
    return cores() < (os.cpu_count() or cores())


def threads_per_process(local_processes):
    """The intra-op threads each of `local_processes` on this machine gets
    when the user chose none: the cores this process may use, shared out.
    (torchrun gives 1 each; processes left at an engine's default each take
    every core, and slow one another down several times.)"""
    return max(1, cores() // max(1, local_processes))


def thread_variables(local_processes):
    """The variables that give each of `local_processes` processes started
    together on this machine its share of the cores, as torchrun does, when
    the user chose none: OMP_NUM_THREADS (torch, and OpenMP in any engine)
    and TF_NUM_INTRAOP_THREADS (TensorFlow's own pool). {} for one process.
    (XLA's CPU client, JAX's, reads no such variable.)"""
    if local_processes < 2 or chosen_threads():
        return {}
    threads = str(threads_per_process(local_processes))
    return {"OMP_NUM_THREADS": threads, "TF_NUM_INTRAOP_THREADS": threads}


def _warn_past_cores(count):
    """Far more CPU devices than cores is allowed (a test of a many-device
    program on a laptop); said once per process, with its cost."""
    import warnings

    usable = cores()
    if count <= PAST_CORES * usable or count in _WARNED:
        return
    _WARNED.add(count)
    warnings.warn(
        f"{CPU_DEVICES_VARIABLE}={count} asks for more than {PAST_CORES} CPU devices per "
        f"core: this process may use {usable} core(s). It works: each device gets a thread of its own "
        f"(with torch, a process of its own, holding the engine and a copy of the "
        f"model), and they take turns on the cores, so training is no faster than on "
        f"{usable} device(s) and takes more memory and switching. Set "
        f"{CPU_DEVICES_VARIABLE}={usable} or fewer unless you are testing a many-device "
        "program.",
        errors.CpuDevicesWarning, stacklevel=3)


def cuda_index(environment, count):
    """The CUDA device this process of `environment` (a cluster.Environment)
    takes among the `count` it sees: its own when the scheduler gave it one
    (count 1), else its local rank. LaunchError when that GPU does not exist."""
    if count == 1:
        return 0
    if not 0 <= environment.local_rank < count:
        raise errors.LaunchError(
            f"This process is local rank {environment.local_rank} on its node "
            f"({environment.name}), which sees {count} CUDA GPU(s): it would take GPU "
            f"{environment.local_rank}, which does not exist. Start at most {count} "
            "processes per node, or give each process its own GPU (CUDA_VISIBLE_DEVICES, "
            "srun --gpus-per-task=1).")
    return environment.local_rank


# The engines Keras can run on (keras-mxnet: mxnet).
KNOWN_ENGINES = ("tensorflow", "jax", "torch", "numpy", "openvino", "mxnet")


def current_backend():
    """The engine Keras runs on (imports keras). Raises EngineUnavailableError
    naming the engine, where its name came from, and the fix."""
    name, source = backend_source()
    if name not in KNOWN_ENGINES:
        raise errors.EngineUnavailableError(
            f"{source.replace('from ', '', 1)} names the engine {name!r}, which Keras "
            "does not know. Use one "
            f"of: {', '.join(KNOWN_ENGINES)}, e.g. KERAS_BACKEND=jax."
        )
    if importlib.util.find_spec("keras") is None:
        raise errors.EngineUnavailableError(
            "agnostic needs Keras, which is not installed. Install it with an "
            "engine, e.g. `pip install keras jax`, or agnostic's extra in its clone: "
            "`pip install '.[jax]'` (see its README's table of extras)."
        )
    try:
        keras = importlib.import_module("keras")
    except (ImportError, ValueError) as error:  # keras-mxnet: ValueError
        switch = _another_engine("e.g. `pip install keras jax`")
        raise errors.EngineUnavailableError(
            f"Keras is installed, and its engine is {name} ({source}), which cannot be "
            f"imported: {error}. Install {name}, {switch}."
        ) from error
    return keras.backend.backend()


def missing_engine(environ=None):
    """Why Keras's import will fail, or None: the engine it will pick is not
    installed (Keras then stops with "No module named ..."). Found without
    importing Keras or the engine; None where Keras itself is missing (the
    program's import says that plainly) or the engine is not one of these."""
    name, source = backend_source(environ)
    if name not in ("tensorflow", "jax", "torch", "mxnet"):
        return None
    if name in sys.modules or importlib.util.find_spec("keras") is None or \
            importlib.util.find_spec(name) is not None:
        return None
    switch = _another_engine("e.g. `pip install jax`")
    return (f"Keras's engine is {name} ({source}), which is not installed, so importing "
            f"Keras will fail with \"No module named '{name}'\". Install {name}, {switch}.")


def _another_engine(otherwise):
    """The advice's second half: an installed engine to choose instead, or
    `otherwise` where none is installed."""
    installed = [e for e in ("tensorflow", "jax", "torch", "mxnet")
                 if importlib.util.find_spec(e) is not None]
    if not installed:
        return otherwise
    return (f"or choose an installed one, e.g. KERAS_BACKEND={installed[0]} (installed: "
            f"{', '.join(installed)})")


def backend_source(environ=None):
    """The engine Keras will pick and where that comes from: KERAS_BACKEND,
    the keras.json file Keras reads, or Keras's default."""
    environ = os.environ if environ is None else environ
    name = configured_backend(environ)
    if environ.get("KERAS_BACKEND"):
        return name, "from KERAS_BACKEND"
    home = environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    path = os.path.join(home, "keras.json")
    if os.path.exists(path):
        return name, f"from {path}"
    return name, "from Keras's default, with KERAS_BACKEND unset and no keras.json"


def _tensorflow(environment=None):
    import tensorflow as tf

    if environment is not None and environment.world_size > 1:
        return _tf_workers_listing(tf, environment)
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if gpus:
        return DeviceListing(tuple(gpus), cpus[0], accelerators=True)
    return _cpu_listing(cpus)


def configured_backend(environ=None):
    """The engine Keras will pick, read as Keras reads it, without importing
    Keras: KERAS_BACKEND, else keras.json in KERAS_HOME (or ~/.keras)."""
    environ = os.environ if environ is None else environ
    if environ.get("KERAS_BACKEND"):
        return environ["KERAS_BACKEND"]
    home = environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as handle:
            return json.load(handle).get("backend", "tensorflow")
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def _tf_workers_listing(tf, environment):
    # Every worker computes on its own GPUs, or on its CPU: the strategy
    # wants the same number on each.
    local = [d.name.split("device:")[-1] for d in tf.config.list_logical_devices("GPU")]
    names = tuple(f"/job:worker/task:{index}/device:{device}"
                  for index in range(environment.world_size)
                  for device in (local or ["CPU:0"]))
    return DeviceListing(names, "/job:worker/task:0/device:CPU:0", accelerators=bool(local),
                         num_processes=environment.world_size, process_id=environment.rank)


def _jax(environment=None):
    import jax

    found = jax.devices()  # every process's devices, when there are several
    names = tuple(jax_name(d) for d in found)
    processes = {"num_processes": jax.process_count(), "process_id": jax.process_index()}
    if found[0].platform != "cpu":
        return DeviceListing(names, "cpu:0", accelerators=True, **processes)
    return DeviceListing(names, names[0], accelerators=False,
                         simulated=len(names) > processes["num_processes"], **processes)


def jax_name(device):
    """A JAX device's name in plans and meshes, as Keras's list_devices gives it:
    "cpu:0", "gpu:1"."""
    return f"{device.platform}:{device.id}"


def _mxnet(environment=None):
    import mxnet

    gpus = mxnet.context.num_gpus()
    if gpus:
        return DeviceListing(tuple(f"gpu({i})" for i in range(gpus)), "cpu(0)",
                             accelerators=True)
    # MXNet contexts are names: N cpu(i) contexts need no set-up in the engine.
    count = max(1, requested_cpu_devices())
    return _cpu_listing([f"cpu({i})" for i in range(count)])


def _torch(environment=None):
    import torch

    if torch.cuda.is_available():
        gpus = tuple(f"cuda:{i}" for i in range(torch.cuda.device_count()))
        return DeviceListing(gpus, "cpu", accelerators=True)
    # torch-ddp runs one process per device: N CPU processes need no set-up.
    count = max(1, requested_cpu_devices())
    return _cpu_listing([f"cpu:{i}" for i in range(count)])


def _cpu_listing(cpus):
    simulated = len(cpus) > 1
    if not simulated:
        return DeviceListing((cpus[0],), cpus[0], accelerators=False)
    return DeviceListing(tuple(cpus), cpus[0], accelerators=False, simulated=True)


def _host_only(environment=None):
    return DeviceListing(("cpu:0",), "cpu:0", accelerators=False)


LISTERS = {
    "tensorflow": _tensorflow,
    "jax": _jax,
    "mxnet": _mxnet,
    "torch": _torch,
}


def list_devices(backend, environment=None):
    """The devices `backend` can place replicas on; `environment`: the
    multi-process job this process belongs to (agnostic.cluster), if any."""
    lister = LISTERS.get(backend, _host_only)
    return lister(environment)


def choose(found: Sequence[str], gpus, listing):
    """The device names `gpus` selects, or raises naming what exists."""
    if gpus is None:
        return list(found)
    if isinstance(gpus, int):
        if gpus > len(found):
            raise errors.DeviceRequestError(
                f"gpus={gpus} asks for {gpus} devices, but only {len(found)} "
                f"exist: {device_names(found)}. Pass gpus=None to use all of them, "
                f"or a number up to {len(found)}.{cpu_hint(listing)}"
            )
        return list(found[:gpus])
    missing = [d for d in gpus if d >= len(found)]
    if missing:
        raise errors.DeviceRequestError(
            f"gpus={list(gpus)!r} names device id {missing[0]}, which does "
            f"not exist. The devices are {device_names(found)} (ids 0 to "
            f"{len(found) - 1}).{cpu_hint(listing)}"
        )
    return [found[d] for d in gpus]


def device_names(found):
    return ", ".join(f"{i}: {name}" for i, name in enumerate(found))


def cpu_hint(listing):
    if listing.accelerators:
        return ""
    return (
        " Without accelerators, set AGNOSTIC_CPU_DEVICES=N before starting "
        "Python to split the CPU into N devices."
    )
