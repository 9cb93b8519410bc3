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
import importlib
import importlib.abc
import logging
import os
import sys
import warnings

from agnostic import cluster as cluster_lib
from agnostic import devices as devices_lib
from agnostic import errors
from agnostic.launch import stalls

try:  # installed: beside the package (pyproject.toml); in a source checkout: in it
    import _agnostic_hook as start_hook
except ImportError:
    from agnostic import _agnostic_hook as start_hook


JOIN_FLAG = "AGNOSTIC_JOIN"


def check_variables(environ=None):
    """Raises LaunchError for a value of AGNOSTIC_JOIN, AGNOSTIC_JOIN_SECONDS,
    AGNOSTIC_STALL_SECONDS or AGNOSTIC_START_EARLY that means nothing (at start-up they fall back
    to their defaults, since nothing can be raised there)."""
    environ = os.environ if environ is None else environ
    cluster_lib.switch(environ, JOIN_FLAG, "join the scheduler's job even when the main "
                       "script does not name agnostic", "never join",
                       unset="programs that use agnostic join")
    stalls.stall_seconds(environ)
    cluster_lib.join_seconds(environ)
    from agnostic.launch import early

    early.setting(environ)


# Each engine's set-up is in its folder, agnostic/engines/<engine>/start.py,
# imported by name as the engine is: `split(module, count)` splits the CPU,
# `join(module, environment)` joins the job.
SPLITTERS = ("tensorflow", "jax")
JOINERS = ("tensorflow", "jax", "torch")


def _start(name):
    return importlib.import_module(f"agnostic.engines.{name}.start")


# Set when a program imports agnostic itself (not the start-up hook).
IMPORTED = {}


def _apply(name, module, count):
    if name in SPLITTERS and count > 1:
        try:
            _start(name).split(module, count)
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
    if name == "torch":
        start_early(module)  # where the GPUs are counted
    # Only Keras's engine joins: a library may import another engine too,
    # whose runtime would take the coordinator's port.
    environment = job()
    if environment is not None and devices_lib.configured_backend() == name \
            and joins(environment):
        _start(name).join(module, environment)
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


def agnostic_itself():
    """Whether the program is agnostic's own command (`agnostic info`)."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(main, "name", "") == "agnostic.__main__" or \
        os.path.basename(sys.argv[0] if sys.argv else "") in ("agnostic", "keras-agnostic")


def _starts_early():
    """Whether this process is to start the shim's torch workers before
    the compile line (launch/early.py): a torch program whose main script
    names agnostic, not in a job, not agnostic's own command, not a
    process started to wait. A bad setting is said at the compile line."""
    try:
        if devices_lib.configured_backend() != "torch" or job() is not None:
            return False
        if start_hook.in_a_child_process() or agnostic_itself() or not main_names_agnostic():
            return False
        from agnostic.launch import early, processes

        if not early.setting() or early.PIPE_VARIABLE in os.environ:
            return False
        processes.script_command()  # a LaunchError where it is no script
        return True
    except Exception:
        return False


def start_early(torch=None):
    """Starts the shim's torch workers to wait, as torch is imported, when
    this process will be rank 0 of a job on several devices: the CPU split's
    count, else the GPUs `torch` (once imported) sees."""
    try:
        from agnostic.launch import early

        if early.tried() or not _starts_early():  # decided once started
            return
        count = devices_lib.requested_cpu_devices()
        if count < 2 and torch is not None and torch.cuda.is_available():
            count = torch.cuda.device_count()
        if count >= 2:
            early.start(count)
    except Exception as error:  # the workers start at the compile line, as without it
        logging.getLogger("agnostic").debug("agnostic: no early start: %s", error)


def started_by_hook():
    """Whether agnostic is being imported by the start-up hook, as an engine
    is imported, rather than by the program itself."""
    return bool(getattr(sys.modules.get("_agnostic_hook"), "IMPORTING", None))


def engine_spec(name, path=None, target=None):
    """The set-up finder's answer as engine `name` is imported, for a
    start-up hook of an earlier release, which calls this by name (today's
    finds the finder in sys.meta_path itself)."""
    hook = next((f for f in sys.meta_path if isinstance(f, _AfterImport)), None)
    return None if hook is None else hook.find_spec(name, path, target)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs an engine's set-up right after its top module has executed. The
    start-up hook finds it in sys.meta_path by AGNOSTIC_SET_UP."""

    AGNOSTIC_SET_UP = True

    def __init__(self):
        self.values = {}  # engine module name -> its CPU split (0: none)
        self.pending = set()
        self.finding = set()  # names being looked up in the other finders

    def find_spec(self, name, path=None, target=None):
        # Asked without an import too (importlib.util.find_spec): the set-up
        # stays pending until the engine's module is executed, once.
        if name not in self.pending or name in self.finding:
            return None
        self.finding.add(name)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(name, path, target)
                    if spec is not None:
                        break
        finally:
            self.finding.discard(name)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            if name == "torch" and name in self.pending:
                start_early()  # beside this process's import, where it can
            execute(module)
            if name in self.pending:
                self.pending.discard(name)
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
    if "torch" in sys.modules:
        start_early(sys.modules["torch"])
    elif _starts_early():  # as torch is imported
        values.setdefault("torch", 0)
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
