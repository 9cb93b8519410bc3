"""Engine set-up that must happen as the engine is imported, before the
script builds a model:

- AGNOSTIC_CPU_DEVICES=N: split the host CPU into N devices (TensorFlow, JAX);
- LOCAL_RANK (torchrun, or agnostic's own workers): this torch process's GPU;
- KERAS_DISTRIBUTION_NUM_PROCESSES > 1: JAX joins its processes;
- TF_CONFIG naming several workers (Keras on TensorFlow): the workers'
  MultiWorkerMirroredStrategy, which the engine allows only before it starts.

A user's script may import the engine first, so `install()` puts a hook on the
import of each engine. The package's .pth file calls it at interpreter start
when either variable is set; `import agnostic` calls it too.
"""
import importlib.abc
import os
import signal
import sys
import time
import warnings

from agnostic import devices as devices_lib
from agnostic import errors


# The TensorFlow workers' strategy, made as TensorFlow is imported: the
# strategy (or the error that prevented it) under "strategy" / "error".
TF_WORKERS = {}
JOIN_VARIABLE = "AGNOSTIC_JOIN_SECONDS"


def join_seconds():
    """How long processes wait for each other as the engine starts."""
    raw = os.environ.get(JOIN_VARIABLE, "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else 60


def _split_tensorflow(tf, count):
    cpus = tf.config.list_physical_devices("CPU")
    configured = len(tf.config.get_logical_device_configuration(cpus[0]) or ())
    if count > 1 and configured != count:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * count
        )
    _join_tensorflow(tf)


def _join_tensorflow(tf):
    # The strategy configures the engine's collective runtime, which
    # TensorFlow accepts only before it has run anything: the user's script
    # builds its model before calling backend_agnostic_compile.
    cluster = devices_lib.tf_config_workers()
    if TF_WORKERS or not cluster or devices_lib.configured_backend() != "tensorflow":
        return
    # The engine waits, without limit, until every worker has started.
    workers, task = cluster
    seconds = join_seconds()
    watchdog = _watchdog(seconds, (
        f"agnostic: TensorFlow worker {task} of {len(workers)} did not reach every "
        f"worker named in TF_CONFIG ({', '.join(workers)}) within {seconds} s, so "
        "nothing was trained. Start every worker (or use `agnostic launch`, which "
        "starts them together), check the addresses and that their ports are "
        f"open, or set {JOIN_VARIABLE} to wait longer."
    ))
    try:
        TF_WORKERS["strategy"] = tf.distribute.MultiWorkerMirroredStrategy()
    except Exception as error:  # the engine raises several types here
        TF_WORKERS["error"] = error
    finally:
        _stop(watchdog)


def _watchdog(seconds, message):
    """A process that ends this one after `seconds`, saying why, unless
    stopped first. The engine waits inside its runtime holding the
    interpreter, where no thread or signal handler of ours would run."""
    if not hasattr(os, "fork"):
        return None
    parent = os.getpid()
    child = os.fork()
    if child:
        return child
    try:  # the child: only calls that need no lock another thread may hold
        time.sleep(seconds)
        if os.getppid() == parent:
            os.write(2, message.encode() + b"\n")
            os.kill(parent, signal.SIGKILL)
    finally:
        os._exit(0)


def _stop(watchdog):
    if watchdog:
        os.kill(watchdog, signal.SIGKILL)
        os.waitpid(watchdog, 0)


def _split_jax(jax, count):
    if count > 1 and jax.config.jax_num_cpu_devices != count:
        jax.config.update("jax_num_cpu_devices", count)
    _join_jax(jax)


def _join_jax(jax):
    # Several JAX processes (agnostic launch, or Keras's own variables set by
    # hand) meet before JAX starts its backend, as keras.distribution.initialize
    # would make them.
    processes = int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1") or 1)
    if processes > 1 and not jax.distributed.is_initialized():
        jax.distributed.initialize(
            coordinator_address=os.environ["KERAS_DISTRIBUTION_JOB_ADDRESSES"].split(",")[0],
            num_processes=processes,
            process_id=int(os.environ["KERAS_DISTRIBUTION_PROCESS_ID"]),
            initialization_timeout=join_seconds(),
        )


def _pin_torch(torch, local_rank):
    # Keras on torch puts variables on the current CUDA device.
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)


SPLITTERS = {"tensorflow": _split_tensorflow, "jax": _split_jax}


def _apply(name, module, count):
    if name == "torch":
        _pin_torch(module, count)
        return
    try:
        SPLITTERS[name](module, count)
    except (RuntimeError, ValueError) as error:
        warnings.warn(
            f"{devices_lib.CPU_DEVICES_VARIABLE}={count} could not split the "
            f"CPU for {name}: its runtime had already started ({error}). Set "
            "the variable before Python starts, with agnostic installed, so "
            "the split happens as the engine is imported.",
            errors.CpuDevicesWarning,
            stacklevel=2,
        )


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a splitter right after its engine's top module has executed."""

    def __init__(self, values):
        self.values = values  # engine module name -> the number its set-up takes
        self.pending = set(values)

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        self.pending.discard(name)
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _apply(name, module, self.values[name])

        spec.loader.exec_module = exec_module
        return spec


def install():
    """Arranges the set-up for every engine; safe to call more than once."""
    if any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    values = {}
    try:
        count = devices_lib.requested_cpu_devices()
    except errors.DeviceRequestError:
        count = 0  # resolve() raises it with the full message
    if count >= 2:
        values.update((name, count) for name in SPLITTERS)
    if int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1") or 1) > 1:
        values.setdefault("jax", 1)
    if devices_lib.tf_config_workers():
        values.setdefault("tensorflow", 1)
    local_rank = os.environ.get("LOCAL_RANK", "")
    if local_rank.isdigit():
        values["torch"] = int(local_rank)
    if not values:
        return
    hook = _AfterImport(values)
    for name in values:
        if name in sys.modules:
            hook.pending.discard(name)
            _apply(name, sys.modules[name], values[name])
    sys.meta_path.insert(0, hook)
