"""A process of a group that stops running is ended and named within a
bound: AGNOSTIC_STALL_SECONDS (default 60; 0 turns this off). Each process
of a group started by agnostic's launchers (the shim's rank 0, `agnostic
launch`) or by torchrun beats (launch/heartbeat.py), and is watched by one
that does not wait on it:

- `agnostic launch`: its node's launcher, which runs no training;
- the shim: rank 0 (the launcher) watches its workers, the workers rank 0;
- torchrun, whose agent is not ours: the processes of a node watch each
  other, and the first to claim the verdict acts.

The silent process is ended (SIGKILL: a stopped process takes no other
signal) and named with its rank, process and host. A process that runs but
never reaches a collective (a loop in a script) still beats: the engine's
own timeout names that one.
"""
import logging
import os
import shutil
import tempfile
import threading
import time

from agnostic import cluster, errors
from agnostic.launch import heartbeat
from agnostic.launch.heartbeat import STALL_VARIABLE

logger = logging.getLogger("agnostic")
STALL_SECONDS = 60
# The folder a launcher gives its processes for their heartbeats.
FOLDER_VARIABLE = "AGNOSTIC_HEARTBEATS"


def stall_seconds(environ=None):
    """AGNOSTIC_STALL_SECONDS as seconds (0: off), else STALL_SECONDS; a
    clear error for a value that is not a number of seconds."""
    return cluster.seconds(
        os.environ if environ is None else environ, STALL_VARIABLE, STALL_SECONDS,
        "how long a process of a group may stop answering before it is ended and named "
        f"(default {STALL_SECONDS}; 0 turns the watch off)")


def watch_peers(folder, seconds, ranks, act):
    """A thread that calls `act(silent)` once, for the first of `ranks`
    (None: every other process of `folder`) that goes silent, when this
    process claims the verdict."""
    me = os.getpid()
    watch = heartbeat.Watch(folder, seconds, ranks)

    def run():
        while True:
            silent = watch.silent()
            if silent is not None and silent.pid != me and heartbeat.claim(folder):
                act(silent)
                return
            time.sleep(heartbeat.interval(seconds))

    threading.Thread(target=run, name="agnostic-heartbeat-watch", daemon=True).start()


# The shim's workers: where rank 0's standard error is (a descriptor each
# inherits), to say why they ended it when its own output is stopped too.
LAUNCHER_STDERR = "AGNOSTIC_LAUNCHER_STDERR"
_started = []


def start(environment):
    """In a process of a group (an agnostic.cluster.Environment), once it
    has joined: beats, and watches whom no launcher of ours watches. Never
    raises (it runs as the engine is imported): a heartbeat that cannot be
    kept is said, and the process trains without it."""
    try:
        seconds = stall_seconds()
    except errors.LaunchError:  # resolve() raises it with the whole message
        seconds = STALL_SECONDS
    if not seconds or _started:
        return
    try:
        _start(environment, seconds)
    except OSError as error:
        logger.warning("agnostic: no heartbeat for this process (%s): if it stops "
                       "answering, it is not named (%s).", error, STALL_VARIABLE)


def _start(environment, seconds):
    """Beats in its launcher's folder, or in the one torchrun's processes share."""
    folder = os.environ.get(FOLDER_VARIABLE)
    if folder:  # one of agnostic's launchers watches this process
        if heartbeat.private(folder):
            _started.append(heartbeat.Beat(folder, environment.rank, seconds))
            if os.environ.get(LAUNCHER_STDERR, "").isdigit():
                stderr = int(os.environ[LAUNCHER_STDERR])
                watch_peers(folder, seconds, {0},
                            lambda silent: _end_the_launcher(silent, seconds, folder, stderr))
    elif environment.name == "torchrun":
        folder = _torchrun_folder()
        if folder is not None:
            _started.append(heartbeat.Beat(folder, environment.rank, seconds, shared=True))
            watch_peers(folder, seconds, None,
                        lambda silent: _end_a_peer(silent, seconds, folder))


def _torchrun_folder():
    """The folder this node's processes share: named for torchrun's agent
    (their parent) and the attempt."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    restart = restart if restart.isdigit() else "0"
    name = f"agnostic-heartbeats-{os.getuid()}-{os.getppid()}-{restart}"
    folder = os.path.join(tempfile.gettempdir(), name)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as error:
        logger.warning("agnostic: no heartbeat folder (%s): a stalled process is not "
                       "named (%s).", error, STALL_VARIABLE)
        return None
    return folder if heartbeat.private(folder) else None


def _end_a_peer(silent, seconds, folder):
    """torchrun: this process saw a peer go silent; torchrun ends the job
    once that peer has ended, naming it (its agent ends the others with a
    signal, before they could remove the folder)."""
    logger.error("agnostic: rank %d (process %d) %s; ending it, so that torchrun stops "
                 "the job.", silent.rank, silent.pid, silent.summary(seconds))
    heartbeat.end(silent)
    shutil.rmtree(folder, ignore_errors=True)


def _end_the_launcher(silent, seconds, folder, stderr):
    """The shim: rank 0, the launcher, went silent; its output is stopped
    with it, so this worker says why on rank 0's standard error, removes the
    folder rank 0 can no longer remove, and ends it (the kernel then ends
    every worker)."""
    message = (f"agnostic: rank 0 (process {silent.pid}, the launcher) "
               f"{silent.summary(seconds)}; ending it and its workers.\n")
    try:
        os.write(stderr, message.encode())
    except OSError:
        logger.error("%s", message.rstrip())
    shutil.rmtree(folder, ignore_errors=True)
    heartbeat.end(silent)
