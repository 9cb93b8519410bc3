"""Engine set-up that must happen as the engine is imported, before the
script builds a model:

- AGNOSTIC_CPU_DEVICES=N: split the host CPU into N devices (TensorFlow, JAX);
- a job of several processes (agnostic.cluster: torchrun, SLURM, mpirun,
  Kubeflow, TF_CONFIG, Keras's variables...): torch pins this process's GPU,
  JAX joins its processes (jax.distributed.initialize), TensorFlow makes the
  workers' MultiWorkerMirroredStrategy, which it allows only before it starts.

A user's script may import the engine first, so `install()` puts a hook on the
import of each engine. The package's .pth file calls it at interpreter start
when one of those variables is set; `import agnostic` calls it too.

Schedulers set their variables in every process they start, whether it
trains with agnostic or not: a job joins only in a program that uses agnostic
(its main script names it, or it imported agnostic itself), or with
AGNOSTIC_JOIN=1; AGNOSTIC_JOIN=0 never joins.
"""
import importlib.abc
import os
import re
import signal
import sys
import time
import warnings

from agnostic import cluster as cluster_lib
from agnostic import devices as devices_lib
from agnostic import errors


# The TensorFlow workers' strategy, made as TensorFlow is imported: the
# strategy (or the error that prevented it) under "strategy" / "error".
TF_WORKERS = {}
JOIN_VARIABLE = "AGNOSTIC_JOIN_SECONDS"
JOIN_FLAG = "AGNOSTIC_JOIN"


def join_seconds():
    """How long processes wait for each other as the engine starts."""
    raw = os.environ.get(JOIN_VARIABLE, "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else 60


def check_variables(environ=None):
    """Raises LaunchError for a value of AGNOSTIC_JOIN or AGNOSTIC_JOIN_SECONDS
    that means nothing (at start-up they fall back to their defaults, since
    nothing can be raised there)."""
    environ = os.environ if environ is None else environ
    flag = environ.get(JOIN_FLAG, "").strip()
    if flag not in ("", "0", "1"):
        raise errors.LaunchError(
            f"{JOIN_FLAG} must be 1 (join the scheduler's job even when the main "
            "script does not name agnostic) or 0 (never join); unset, programs that "
            f"use agnostic join. Received: {JOIN_FLAG}={flag!r}"
        )
    seconds = environ.get(JOIN_VARIABLE, "").strip()
    if seconds and not (seconds.isdigit() and int(seconds) > 0):
        raise errors.LaunchError(
            f"{JOIN_VARIABLE} must be a whole number of seconds, 1 or more (default "
            f"60), such as {JOIN_VARIABLE}=300. Received: {JOIN_VARIABLE}={seconds!r}"
        )


def _split_tensorflow(tf, count):
    cpus = tf.config.list_physical_devices("CPU")
    configured = len(tf.config.get_logical_device_configuration(cpus[0]) or ())
    if count > 1 and configured != count:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * count
        )


def _join_tensorflow(tf, environment):
    # The strategy configures the engine's collective runtime, which
    # TensorFlow accepts only before it has run anything: the user's script
    # builds its model before calling backend_agnostic_compile.
    if TF_WORKERS:
        return
    try:
        workers = worker_addresses(environment)
    except errors.LaunchError as error:
        TF_WORKERS["error"] = error
        return
    # The engine waits, without limit, until every worker has started.
    seconds = join_seconds()
    watchdog = _watchdog(seconds, (
        f"agnostic: TensorFlow worker {environment.rank} of {len(workers)} did not "
        f"reach every worker ({', '.join(workers)}, from {environment.name}) within "
        f"{seconds} s, so nothing was trained. Start every worker (or use `agnostic "
        "launch`, which starts them together), check the addresses and that their "
        f"ports are open, or set {JOIN_VARIABLE} to wait longer."
    ))
    try:
        # Every process is a worker, the chief first: a TFJob's chief too.
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({"worker": workers}), task_type="worker",
            task_id=environment.rank, rpc_layer="grpc")
        TF_WORKERS["strategy"] = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver)
    except Exception as error:  # the engine raises several types here
        TF_WORKERS["error"] = error
    finally:
        _stop(watchdog)


def worker_addresses(environment):
    """Each process's HOST:PORT for TensorFlow's workers, in rank order: as
    TF_CONFIG lists them (TensorFlow's own variable, which `agnostic launch`
    sets beside the others), else each host with its own port (the
    coordinator's port plus the rank, so that tasks sharing a host differ)."""
    from agnostic.cluster import tf_config

    if tf_config.detect(os.environ) is not None:
        return tf_config.worker_addresses(os.environ)
    hosts = environment.hosts
    if hosts is None and environment.name == "torchrun" and environment.port is not None:
        from agnostic.cluster import torchrun

        hosts = torchrun.exchange_hosts(environment, join_seconds())
    if hosts is None or environment.port is None:
        raise errors.LaunchError(
            f"TensorFlow's workers need every process's address, and {environment.name} "
            "does not say where each process runs. Set TF_CONFIG in each process, or "
            "start the processes with `agnostic launch`, torchrun or srun."
        )
    port = environment.engine_port
    return [f"{host}:{port + rank}" for rank, host in enumerate(hosts)]


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


def _join_jax(jax, environment):
    # The processes meet before JAX starts its backend, as
    # keras.distribution.initialize would make them. Arguments, not JAX's own
    # detection: under SLURM it would give each process one device, while one
    # process per node should drive all of the node's.
    if jax.distributed.is_initialized():
        return
    local_devices = None
    if environment.local_world_size > 1:
        local_devices = [environment.local_rank]  # several processes per node
    jax.distributed.initialize(
        coordinator_address=f"{environment.coordinator}:{environment.engine_port}",
        num_processes=environment.world_size, process_id=environment.rank,
        local_device_ids=local_devices, initialization_timeout=join_seconds(),
    )


def _pin_torch(torch, environment):
    # Keras on torch puts variables on the current CUDA device: this process's.
    if not torch.cuda.is_available():
        return
    count = torch.cuda.device_count()
    if count == 1:  # the scheduler gave each process its own GPU
        torch.cuda.set_device(0)
    elif environment.local_rank < count:
        torch.cuda.set_device(environment.local_rank)


SPLITTERS = {"tensorflow": _split_tensorflow, "jax": _split_jax}
JOINERS = {"tensorflow": _join_tensorflow, "jax": _join_jax, "torch": _pin_torch}
# Set when a program imports agnostic itself (not the .pth at start-up).
IMPORTED = {}


def _apply(name, module, count):
    if name in SPLITTERS and count > 1:
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
    # Only Keras's engine joins: a library may import another engine too,
    # whose runtime would take the coordinator's port.
    environment = job()
    if environment is not None and devices_lib.configured_backend() == name \
            and joins(environment):
        JOINERS[name](module, environment)


def job():
    """This process's multi-process job, or None (also when its variables
    are wrong: resolve() raises that error with the whole message)."""
    try:
        return cluster_lib.job()
    except errors.AgnosticError:
        return None


def joins(environment):
    """Whether this process joins `environment`'s job as its engine starts."""
    chosen = os.environ.get(JOIN_FLAG, "").strip()
    if chosen in ("0", "1"):
        return chosen == "1"
    return environment.requested or bool(IMPORTED) or main_names_agnostic()


def main_names_agnostic():
    """Whether the program that runs (a script, `-m module` or `-c code`)
    imports agnostic: read from its source, since it may import the engine
    before agnostic."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    try:
        if path:
            with open(path, encoding="utf-8", errors="replace") as handle:
                source = handle.read()
        else:
            source = " ".join(getattr(sys, "orig_argv", sys.argv))
    except OSError:
        return False
    return re.search(r"\b(from|import)\s+agnostic\b", source) is not None


def started_by_site():
    """Whether agnostic is being imported by the .pth file at interpreter
    start (Python's site module), rather than by the program."""
    frame = sys._getframe(1)
    while frame is not None:
        # Python 3.11 freezes site ("<frozen site>"): ask the frame's module.
        if frame.f_code.co_name == "addpackage" and frame.f_globals.get("__name__") == "site":
            return True
        frame = frame.f_back
    return False


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs an engine's set-up right after its top module has executed."""

    def __init__(self):
        self.values = {}  # engine module name -> its CPU split (0: none)
        self.pending = set()

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


def _wanted():
    """engine module name -> its CPU split, for each engine that needs set-up."""
    values = {}
    try:
        count = devices_lib.requested_cpu_devices()
    except errors.DeviceRequestError:
        count = 0  # resolve() raises it with the full message
    if count >= 2:
        values.update((name, count) for name in SPLITTERS)
    if job() is not None:
        for name in JOINERS:
            values.setdefault(name, 0)
    return values


def install(imported=False):
    """Arranges the set-up for every engine; safe to call more than once, and
    again once variables have changed (Ray sets TF_CONFIG in a running
    process). `imported`: the program imported agnostic itself."""
    if imported:
        IMPORTED["by"] = "the program"
    values = _wanted()
    if not values:
        return
    hook = next((f for f in sys.meta_path if isinstance(f, _AfterImport)), None)
    if hook is None:
        hook = _AfterImport()
        sys.meta_path.insert(0, hook)
    for name, value in values.items():
        hook.values[name] = value
        if name in sys.modules:
            hook.pending.discard(name)
            _apply(name, sys.modules[name], value)
        else:
            hook.pending.add(name)
