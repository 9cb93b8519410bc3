"""Where this process stands in a job that a scheduler (or a person) started:
one small module per environment, each answering the same questions, tried
in a fixed order. The first that finds its variables wins.

    >>> from agnostic import cluster
    >>> cluster.detect()          # None when started plainly
    Environment(name='slurm', world_size=4, rank=1, ...)
"""
import dataclasses
import importlib
import os
import sys
from typing import Optional, Sequence

from agnostic import errors

# Explicit variables first (they also override what a scheduler says), then
# the schedulers, as Lightning and JAX order theirs.
ORDER = (
    "agnostic.cluster.agnostic_launch",  # sets torch's, TF's and Keras's variables too
    "agnostic.cluster.torchrun",
    "agnostic.cluster.keras_distribution",
    "agnostic.cluster.tf_config",
    "agnostic.cluster.rank_variables",
    "agnostic.cluster.slurm",
    "agnostic.cluster.openmpi",
    "agnostic.cluster.kubeflow_jax",
    "agnostic.cluster.lsf",
)
# Environments whose variables ask this very process to train with others
# (set for it by hand, by agnostic, by TensorFlow's or Keras's conventions).
# The others are schedulers: every process they start has their variables,
# whether it trains with agnostic or not.
REQUESTED = ("agnostic-launch", "keras-distribution", "tf-config", "rank-variables")
# How long processes and nodes wait for each other to join (join_seconds).
JOIN_SECONDS = 60
JOIN_VARIABLE = "AGNOSTIC_JOIN_SECONDS"
# A coordinator port the same on every process of a job, from the job's id,
# where the scheduler names none.
PORT_BASE = 15000
PORT_RANGE = 20000


@dataclasses.dataclass(frozen=True)
class Environment:
    """One process's place in a multi-process job."""

    name: str  # "torchrun", "slurm", ...
    world_size: int  # processes in the job
    rank: int  # this process, 0 is the chief
    local_rank: int = 0  # among the processes of its node
    node_rank: int = 0
    coordinator: Optional[str] = None  # the chief's host; None: shared at start
    port: Optional[int] = None
    started_by_scheduler: bool = True  # False: agnostic starts the processes
    local_world_size: int = 1  # processes on this node
    # Every process's host, in rank order, where the scheduler says it (a
    # sequence; SLURM's is made on first use).
    hosts: Optional[Sequence[str]] = None
    # The launcher's own store listens on `port` (torchrun's agent): torch
    # joins it there, the other engines' coordinators take the ports after it.
    port_taken: bool = False

    @property
    def is_chief(self):
        return self.rank == 0

    @property
    def requested(self):
        """Whether the variables were set for this process to train with
        others (not merely inherited from a scheduler)."""
        return self.name in REQUESTED

    @property
    def address(self):
        """The coordinator as a URL: torch's init_method."""
        return f"tcp://{self.coordinator}:{self.port}"

    @property
    def engine_port(self):
        """The first port JAX's coordinator or TensorFlow's workers use."""
        return self.port + 1 if self.port_taken else self.port


# What detect() found in this process's own variables, with those variables:
# while they stay as they were, the start-up hook, the plan and `agnostic
# info` see one Environment.
_detected = None


def detect(environ=None):
    """The first environment of ORDER present in `environ`, or None; for
    this process's own variables (no `environ`), detected once while they
    stay as they were."""
    global _detected
    if environ is not None:
        return _detect(environ)
    variables = frozenset(os.environ.items())
    if _detected is None or _detected[0] != variables:
        # A bad value raises here, and is said each time.
        _detected = (variables, _detect(os.environ))
    return _detected[1]


def _detect(environ):
    for module_name in ORDER:
        found = importlib.import_module(module_name).detect(environ)
        if found is not None:
            return found
    return None


def job(backend=None):
    """This process's job of several processes: the environment found, or
    a torch group that exists already; None for a plain process (or a job of
    one process)."""
    found = detect() or existing_torch_group(backend)
    return found if found is not None and found.world_size > 1 else None


def whole(raw, least=None):
    """`raw` (text, or a number) as an int of at least `least`, or None.
    Every whole number agnostic reads, a variable's or a flag's, is read here."""
    try:
        value = int(str(raw).strip())
    except ValueError:
        return None
    return None if least is not None and value < least else value


def whole_number(environ, name, default=None, least=0):
    """`environ[name]` as an int of at least `least`, or a LaunchError that
    names the variable, its value and what was expected."""
    raw = environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise errors.LaunchError(f"{name} is not set, and this environment needs it.")
        return default
    value = whole(raw, least)
    if value is None:
        raise errors.LaunchError(
            f"{name} must be a whole number of at least {least}. Received: {name}={raw!r}"
        )
    return value


def join_seconds(environ=None):
    """How long processes and nodes wait for each other to join:
    AGNOSTIC_JOIN_SECONDS, else JOIN_SECONDS; a LaunchError for a value
    that is not a whole number of seconds, 1 or more."""
    raw = (os.environ if environ is None else environ).get(JOIN_VARIABLE, "").strip()
    if not raw:
        return JOIN_SECONDS
    if not (raw.isdigit() and int(raw) > 0):
        raise errors.LaunchError(
            f"{JOIN_VARIABLE} must be a whole number of seconds, 1 or more (default "
            f"{JOIN_SECONDS}), such as {JOIN_VARIABLE}=300. Received: {JOIN_VARIABLE}={raw!r}")
    return int(raw)


def join_seconds_at_start():
    """join_seconds() as an engine starts, where nothing can be raised: a
    bad value (which resolve() and backend_agnostic_compile refuse, naming
    it) is the default there."""
    try:
        return join_seconds()
    except errors.LaunchError:
        return JOIN_SECONDS


def switch(environ, name, one, zero, unset=""):
    """`name`'s value: "" (unset), "0" or "1"; a LaunchError that says what
    1 and 0 mean (and unset, where given) for any other value."""
    value = environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        said = f"; unset, {unset}" if unset else ""
        raise errors.LaunchError(
            f"{name} must be 1 ({one}) or 0 ({zero}){said}. Received: {name}={value!r}")
    return value


def seconds(environ, name, default, meaning, error=errors.LaunchError):
    """`environ[name]` as a number of seconds, 0 or more, else `default`
    where it is unset; or `error` saying `meaning` (what the seconds are,
    then the default's parenthesis) with the value received."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise error(f"{name} must be a number of seconds, 0 or more: {meaning}. "
                    f"Received: {name}={raw!r}")
    return value


def port_number(environ, name, default=None, after=0):
    """`environ[name]` as a TCP port, 1 to 65535 - `after` (the ports the
    job takes after it), or a LaunchError naming the variable and value."""
    raw = environ.get(name)
    if (raw is None or raw == "") and default is not None:
        return default
    highest = HIGHEST_PORT - after
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if not 0 < value <= highest:
        taken = f" (the job also takes the {after} port(s) after it)" if after else ""
        raise errors.LaunchError(
            f"{name} must be a free TCP port, from 1 to {highest}{taken}, such as "
            f"{name}=29500. Received: {name}={raw!r}"
        )
    return value


HIGHEST_PORT = 65535


def job_port(environ, job_id):
    """MASTER_PORT when set, else a port derived from the job's id."""
    if environ.get("MASTER_PORT"):
        return port_number(environ, "MASTER_PORT")
    return PORT_BASE + job_id % PORT_RANGE


def text(environ, name, default=None):
    """`environ[name]`, a host name or address: not empty or blank."""
    raw = environ.get(name)
    if raw is None and default is not None:
        return default
    if raw is None or not raw.strip() or any(c.isspace() for c in raw.strip()):
        raise errors.LaunchError(
            f"{name} must be the coordinator's host name or address, such as "
            f"{name}=10.0.0.1. Received: {name}={raw!r}"
        )
    return raw.strip()


def size_and_rank(environ, size_name, rank_name, rank_default=None):
    """(processes, this process's rank) from two variables, checked."""
    world_size = whole_number(environ, size_name, least=1)
    rank = whole_number(environ, rank_name, default=rank_default)
    check_rank(rank_name, rank, world_size)
    return world_size, rank


def check_rank(name, rank, world_size):
    if not 0 <= rank < world_size:
        raise errors.LaunchError(
            f"{name} must be a rank from 0 to {world_size - 1}: the job has {world_size} "
            f"process(es). Received: {name}={rank}"
        )


def existing_torch_group(backend):
    """A torch process group made before agnostic was called (Ray Train's
    torch workers make theirs), as an Environment; None otherwise. Imports
    nothing: torch is asked only when the program has imported it."""
    distributed = sys.modules.get("torch.distributed") if backend == "torch" else None
    if distributed is None or not distributed.is_available() \
            or not distributed.is_initialized():
        return None
    local_rank = os.environ.get("LOCAL_RANK", "")  # Ray Train sets it
    return Environment("torch.distributed", distributed.get_world_size(),
                       distributed.get_rank(),
                       local_rank=int(local_rank) if local_rank.isdigit() else 0)
