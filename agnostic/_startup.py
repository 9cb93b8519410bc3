"""Engine set-up that must happen before the engine's runtime starts:

- AGNOSTIC_CPU_DEVICES=N: split the host CPU into N devices (TensorFlow, JAX);
- a job of several processes (agnostic.cluster: torchrun, SLURM, mpirun,
  Kubeflow, TF_CONFIG, Keras's variables...): torch pins this process's GPU,
  JAX joins its processes (jax.distributed.initialize), TensorFlow makes the
  workers' MultiWorkerMirroredStrategy.

Before the runtime starts, not before the engine is imported: TensorFlow
2.21 accepts logical devices and MultiWorkerMirroredStrategy after `import
tensorflow` or `import keras`, and JAX accepts jax_num_cpu_devices and
jax.distributed.initialize after `import jax` or `import keras`; both refuse
once anything has run (a layer built, an op, jax.devices()). So `install()`,
which `import agnostic` calls, sets up an engine already imported, and puts
a hook on the import of the others.

That serves a script that imports agnostic before it builds anything. A
script that builds its model first and imports agnostic at the compile line
needs the set-up as the engine is imported: the start-up hook does that
(_agnostic_hook, run by the package's .pth file when one of agnostic's or a
scheduler's variables is set). It reads no value and imports nothing as
Python starts; at the first engine import it imports agnostic only in a
program whose main script, `-m` module or `-c` code imports agnostic, or
with AGNOSTIC_JOIN=1. Any other program (a data-preparation script under
srun, a plain TensorFlow program in a TFJob pod) runs as without agnostic.

A job is joined by a program that uses agnostic (its main script names it,
or it imported agnostic itself), or with AGNOSTIC_JOIN=1; AGNOSTIC_JOIN=0
never joins. A wrong variable is ignored here and raised, with the whole
message, by resolve() and backend_agnostic_compile.
"""
import importlib.abc
import os
import signal
import sys
import time
import warnings

from agnostic import cluster as cluster_lib
from agnostic import devices as devices_lib
from agnostic import errors
from agnostic.cluster import listen
from agnostic.launch import stalls
from agnostic.compat import jax_joined, tf_collective_server

try:  # installed: beside the package (pyproject.toml); in a source checkout: in it
    import _agnostic_hook as start_hook
except ImportError:
    from agnostic import _agnostic_hook as start_hook


# The TensorFlow workers' strategy, made as TensorFlow is imported: the
# strategy (or the error that prevented it) under "strategy" / "error".
TF_WORKERS = {}
JOIN_VARIABLE = cluster_lib.JOIN_VARIABLE
JOIN_FLAG = "AGNOSTIC_JOIN"


def join_seconds():
    """How long processes wait for each other as the engine starts (a bad
    value, refused by check_variables, is the default here: nothing can be
    raised at start-up)."""
    try:
        return cluster_lib.join_seconds()
    except errors.LaunchError:
        return cluster_lib.JOIN_SECONDS


def check_variables(environ=None):
    """Raises LaunchError for a value of AGNOSTIC_JOIN, AGNOSTIC_JOIN_SECONDS
    or AGNOSTIC_STALL_SECONDS that means nothing (at start-up they fall back to their defaults, since
    nothing can be raised there)."""
    environ = os.environ if environ is None else environ
    flag = environ.get(JOIN_FLAG, "").strip()
    if flag not in ("", "0", "1"):
        raise errors.LaunchError(
            f"{JOIN_FLAG} must be 1 (join the scheduler's job even when the main "
            "script does not name agnostic) or 0 (never join); unset, programs that "
            f"use agnostic join. Received: {JOIN_FLAG}={flag!r}"
        )
    stalls.stall_seconds(environ)
    cluster_lib.join_seconds(environ)


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
    # The engine waits, without limit, until every worker has started: at
    # the bound, the workers whose servers do not answer are named.
    seconds = join_seconds()
    others = listen.resolved([a for r, a in enumerate(workers) if r != environment.rank])

    def message():
        missing = listen.unreachable(others)
        named = ", ".join(f"worker {workers.index(a)} at {a}" for a in missing[:20])
        return (
            f"agnostic: TensorFlow worker {environment.rank} of {len(workers)} (from "
            f"{environment.name}) did not reach every worker within {seconds} s, so "
            "nothing was trained. " + (
                f"Not answering: {named}{', ...' if len(missing) > 20 else ''}. "
                if missing else f"Every worker's port answers ({', '.join(workers)}), but "
                "not every worker joined. ") +
            "Start every worker (or use `agnostic launch`, which starts them together), "
            f"check the addresses and that their ports are open, or set {JOIN_VARIABLE} "
            "to wait longer.")

    watchdog = _watchdog(seconds, message)
    try:
        # One collective runtime in this process, also where the program
        # makes its own strategy for the same workers before or after this one.
        tf_collective_server.serve_once()
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
    if port + len(hosts) - 1 > cluster_lib.HIGHEST_PORT:
        raise errors.LaunchError(
            f"TensorFlow's {len(hosts)} workers take one port each from {port}, which "
            f"runs past {cluster_lib.HIGHEST_PORT}. Choose a lower MASTER_PORT. Received: "
            f"MASTER_PORT={environment.port} ({environment.name})")
    return [listen.host_port(host, port + rank) for rank, host in enumerate(hosts)]


def _watchdog(seconds, message):
    """A process that ends this one after `seconds`, saying why, unless
    stopped first. The engine waits inside its runtime holding the
    interpreter, where no thread or signal handler of ours would run.
    `message`: text, or a function giving it then (it may probe peers)."""
    if not hasattr(os, "fork"):
        return None
    parent = os.getpid()
    child = os.fork()
    if child:
        return child
    try:  # the child: only calls that need no lock another thread may hold
        time.sleep(seconds)
        if os.getppid() == parent:
            if callable(message):
                try:
                    message = message()
                except Exception as error:  # the process ends all the same
                    message = f"agnostic: the join timed out ({error})"
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
    # JAX aborts the process when its own bound passes, without naming
    # anyone: a watchdog ends it first, saying who is missing where it can.
    # Process 0's coordinator listens on the job's address (cluster.listen),
    # unless JAX_COORDINATOR_BIND_ADDRESS (JAX's own variable) says where.
    import inspect

    if jax.distributed.is_initialized():
        return
    local_devices = None
    if environment.local_world_size > 1:
        local_devices = [environment.local_rank]  # several processes per node
    seconds, size, rank = join_seconds(), environment.world_size, environment.rank
    coordinator = listen.host_port(environment.coordinator, environment.engine_port)
    options = {}
    if rank == 0 and not os.environ.get("JAX_COORDINATOR_BIND_ADDRESS"):
        address = listen.local_address(environment.coordinator, "the coordinator's address")
        bind = listen.host_port(address, environment.engine_port)
        # A port another process holds, said before JAX tries it: JAX raises
        # a bare "Failed to start RPC server", or, where the holder shares
        # ports as gRPC servers do (SO_REUSEPORT), waits for its bound.
        holding = listen.held(address, environment.engine_port)
        if holding is not None:
            raise _port_held(bind, size, environment, holding)
        if "coordinator_bind_address" in inspect.signature(
                jax.distributed.initialize).parameters:
            options["coordinator_bind_address"] = bind
    reach = listen.resolved([coordinator])

    def message():
        if rank == 0:
            who = ("process 1 did not arrive" if size == 2 else
                   f"some of processes 1 to {size - 1} did not arrive (JAX does not say which)")
        elif listen.unreachable(reach):
            who = f"process 0's coordinator at {coordinator} does not answer: process 0 is missing"
        else:
            who = (f"process 0's coordinator at {coordinator} answers, but not all of "
                   f"the {size} processes joined it")
        return (f"agnostic: JAX process {rank} of {size} (from {environment.name}) waited "
                f"{seconds} s for the others, so nothing was trained: {who}. Start every "
                "process, check the address and that the port is open between the "
                f"machines, or set {JOIN_VARIABLE} to wait longer.")

    watchdog = _watchdog(seconds, message)
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=size, process_id=rank,
            local_device_ids=local_devices, initialization_timeout=seconds + 10, **options)
        # The program's own join, as Keras's and JAX's guides write it, is this one.
        jax_joined.keep_join(jax, size, rank, environment.name)
    except Exception as error:  # JAX's XlaRuntimeError: said plainly when it is the port
        if rank == 0 and "failed to start rpc server" in str(error).lower():
            where = options.get("coordinator_bind_address", coordinator)
            raise _port_held(where, size, environment, f"JAX said: {error}") from None
        raise
    finally:
        _stop(watchdog)


def _port_held(where, size, environment, cause):
    return errors.LaunchError(
        f"agnostic: JAX process 0 of {size} (from {environment.name}) could not "
        f"listen on {where} for the job's coordinator, so nothing was trained: "
        f"another process holds that port ({cause}). The port comes from MASTER_PORT, "
        "or, where it is not set, from the job's id. Set MASTER_PORT to a port that "
        "is free on the first node, the same for every process of the job "
        "(JAX's coordinator takes it, or the one after it under torchrun).")


def _pin_torch(torch, environment):
    # Keras on torch puts variables on the current CUDA device: this process's.
    # One visible GPU: the scheduler gave it to this process; several: the
    # local rank's. A local rank past them is left to torch-ddp to refuse.
    if not torch.cuda.is_available():
        return
    try:
        index = devices_lib.cuda_index(environment, torch.cuda.device_count())
    except errors.LaunchError:
        return
    torch.cuda.set_device(index)


SPLITTERS = {"tensorflow": _split_tensorflow, "jax": _split_jax}
JOINERS = {"tensorflow": _join_tensorflow, "jax": _join_jax, "torch": _pin_torch}
# Set when a program imports agnostic itself (not the start-up hook).
IMPORTED = {}


def _apply(name, module, count):
    if name in SPLITTERS and count > 1:
        try:
            SPLITTERS[name](module, count)
        except (RuntimeError, ValueError) as error:
            warnings.warn(
                f"{devices_lib.CPU_DEVICES_VARIABLE}={count} could not split the "
                f"CPU for {name}: its runtime had already started ({error}). Import "
                "agnostic in the main script (agnostic, installed with pip, then "
                "splits the CPU as the engine is imported), or before the program "
                "runs anything on the engine.",
                errors.CpuDevicesWarning,
                stacklevel=2,
            )
    # Only Keras's engine joins: a library may import another engine too,
    # whose runtime would take the coordinator's port.
    environment = job()
    if environment is not None and devices_lib.configured_backend() == name \
            and joins(environment):
        JOINERS[name](module, environment)
        # Once joined (a join holds the interpreter): its heartbeat.
        stalls.start(environment)


def job():
    """This process's multi-process job, or None (also when its variables
    are wrong: resolve() raises that error with the whole message)."""
    try:
        return cluster_lib.job()
    except Exception:  # not only AgnosticError: whatever a bad value raises
        return None


def joins(environment):
    """Whether this process joins `environment`'s job as its engine starts."""
    if start_hook.in_a_child_process():  # a data loader's worker, say
        return False
    chosen = os.environ.get(JOIN_FLAG, "").strip()
    if chosen in ("0", "1"):
        return chosen == "1"
    # Variables meant for this very process (TF_CONFIG, RANK/WORLD_SIZE) are
    # also set for every process of a TFJob pod or a launcher's: a program
    # that never uses agnostic is left alone whatever the environment.
    return bool(IMPORTED) or main_names_agnostic()


def main_names_agnostic():
    """Whether the program that runs (a script, `-m module` or `-c code`)
    imports agnostic: read from its source, since it may import the engine
    before agnostic."""
    return start_hook.names_agnostic()


def started_by_hook():
    """Whether agnostic is being imported by the start-up hook, as an engine
    is imported, rather than by the program itself."""
    return bool(getattr(sys.modules.get("_agnostic_hook"), "IMPORTING", None))


def engine_spec(name, path=None, target=None):
    """The start-up hook's answer as engine `name` is imported: its module
    spec with agnostic's set-up run after it executes, or None when agnostic
    sets nothing up for it."""
    hook = next((f for f in sys.meta_path if isinstance(f, _AfterImport)), None)
    return None if hook is None else hook.find_spec(name, path, target)


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
    except errors.AgnosticError:
        count = 0  # resolve() raises it with the full message
    if count >= 2:
        values.update((name, count) for name in SPLITTERS)
    if job() is not None:
        for name in JOINERS:
            values.setdefault(name, 0)
    return values


def _warnings_to_log():
    show = getattr(start_hook, "warnings_to_log", None)
    if show is None:  # an older hook beside a source checkout's package
        from agnostic import _agnostic_hook

        show = _agnostic_hook.warnings_to_log
    show()


def install(imported=False):
    """Arranges the set-up for every engine; safe to call more than once, and
    again once variables have changed (Ray sets TF_CONFIG in a running
    process). `imported`: the program imported agnostic itself."""
    if imported:
        IMPORTED["by"] = "the program"
    if os.environ.get("AGNOSTIC_WARNINGS") == "log":  # where the hook did not run
        _warnings_to_log()
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
