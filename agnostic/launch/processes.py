"""The processes a launcher starts on its machine, for both launchers (the
shim's rank 0, launch/local.py, and `agnostic launch`, launch/nodes.py): started
so that the kernel ends them when their launcher dies, their ends counted by
one rule, watched by one supervisor until one fails, stops beating or all
end (Processes.supervise; each launcher reacts in its own way), signals passed
on, and stopped (SIGTERM, then SIGKILL after a grace).

The rule: a status other than 0 is a failure, unless it is a preempted
process's (the run was preempted: agnostic/resume/preemption.py), or the process was
killed by a signal after it said it had done its work and left its group
(mark_finished): that is the interpreter's teardown, where torch's
gloo threads can still abort a process (a known torch problem), not training.
"""
import ctypes
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Optional

from agnostic import errors
from agnostic.launch import heartbeat
from agnostic.resume import preemption

logger = logging.getLogger("agnostic")
GRACE_SECONDS = 10
POLL_SECONDS = 0.2  # between a launcher's looks at its processes
# The folder where a launcher's processes say they have finished (the shim's
# workers: their failure reports' folder; `agnostic launch`'s: one of this alone).
FINISHED_VARIABLE = "AGNOSTIC_FINISHED"


def mark_finished(rank):
    """Says, in a launched process, that it has done its work and left its
    group cleanly: what happens after that is the interpreter's teardown."""
    folder = os.environ.get(FINISHED_VARIABLE)
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, f"finished_{rank}"), "w"):
            pass


def finished(folder):
    """The ranks that marked themselves finished in `folder` (none once the
    folder is gone)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return set()
    return {int(name.split("_")[1]) for name in names if name.startswith("finished_")}


def die_with_parent():
    """A `preexec_fn`: on Linux the kernel sends SIGKILL to the child when
    its launcher dies, so none is left behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def script_command():
    """The command that re-runs this script with its arguments."""
    import __main__

    spec = getattr(__main__, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", None):
        return [sys.executable, "-m", spec.name] + sys.argv[1:]
    script = sys.argv[0] if sys.argv else ""
    if not script or script == "-c" or not os.path.exists(script):
        raise errors.LaunchError(
            "agnostic starts one process per device by running your script "
            "again, but this Python was not started from a script file "
            f"(sys.argv[0]={script!r}). Run it as `python train.py`, or start "
            "the processes yourself with `torchrun --nproc-per-node N train.py`."
        )
    return [sys.executable, os.path.abspath(script)] + sys.argv[1:]


def duplicate(descriptor):
    """A copy of `descriptor` (None when this process has none)."""
    try:
        return os.dup(descriptor)
    except OSError:
        return None


def exit_status(code):
    """A process's status as an exit status: killed by a signal counts as 1."""
    return code if 0 < code < 256 else 1


def free_ports(count):
    """`count` different ports free on every interface now."""
    sockets = []
    try:
        for _ in range(count):
            # Not cluster.listen.bound: without SO_REUSEADDR, so that the
            # kernel never hands two of these sockets the same port.
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probe.bind(("", 0))
            sockets.append(probe)
        return tuple(s.getsockname()[1] for s in sockets)
    finally:
        for probe in sockets:
            probe.close()


def free_port():
    return free_ports(1)[0]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What ended a launcher's watch (Processes.supervise): "silent" (the
    process of `rank` stopped answering, `silent` says how long; it is
    killed), "failed" (the first process that ended in failure), "ended"
    (every process ended, none in failure), or "notice" (`notice`, from
    elsewhere: another node's launcher)."""
    kind: str
    rank: Optional[int] = None
    silent: object = None
    notice: Optional[str] = None


class Processes:
    """One launcher's processes by rank, and their supervisor: both
    launchers start them, watch them (supervise) and react to the outcome
    each in its own way. `finished`: the folder where they say they have
    finished (FINISHED_VARIABLE) and beat, or None; `stall`: the seconds
    after which a process that stopped beating is ended (0: never)."""

    def __init__(self, finished=None, stall=0):
        self.by_rank = {}
        self.finished = finished
        self._after_finish = set()  # ranks killed after they had finished
        self.stall = stall if finished else 0
        self._watch = None  # their heartbeats, watched once they started

    def add(self, rank, process):
        self.by_rank[rank] = process

    def __iter__(self):
        return iter(self.by_rank.values())

    def __len__(self):
        return len(self.by_rank)

    def code(self, rank):
        """Rank `rank`'s exit status now, as counted (None: running)."""
        code = self.by_rank[rank].poll()
        if rank in self._after_finish:
            return 0
        if self.finished and code is not None and code < 0 and rank in finished(self.finished):
            logger.debug("agnostic: rank %d ended with status %d after it had finished "
                         "its work and left the group; counted as finished.", rank, code)
            self._after_finish.add(rank)
            return 0
        return code

    def failed(self, preempted=None):
        """The first rank that ended in failure, else None. `preempted`: the
        signal that preempted the run (its processes' ends are no failure)."""
        for rank in self.by_rank:
            code = self.code(rank)
            if code not in (None, 0) and not preemption.is_preempted_status(code, preempted):
                return rank
        return None

    def ended(self):
        return all(process.poll() is not None for process in self)

    def send(self, signum, ranks=None):
        """Passes `signum` on to those still running (of `ranks`: all)."""
        for rank, process in self.by_rank.items():
            if process.poll() is None and (ranks is None or rank in ranks):
                try:
                    process.send_signal(signum)
                except OSError:  # ended meanwhile
                    pass

    def supervise(self, preempted=lambda: None, on_silent=None, wait=None):
        """Watches the processes until something ends the watch; returns its
        `Outcome`. `preempted()`: the signal that preempted the run, if one
        did (its processes' ends are no failure); `on_silent(silent)` runs
        before a silent process is killed (a stopped process takes no other);
        `wait(seconds)` between looks: what another launcher said, else None."""
        while True:
            done = self.ended()  # before the failures: every end is seen
            silent = self._silent()
            if silent is not None:
                if on_silent is not None:
                    on_silent(silent)
                self.by_rank[silent.rank].kill()
                return Outcome("silent", silent.rank, silent=silent)
            rank = self.failed(preempted())
            if rank is not None:
                return Outcome("failed", rank)
            if done:
                return Outcome("ended")
            notice = wait(POLL_SECONDS) if wait else time.sleep(POLL_SECONDS)
            if notice:
                return Outcome("notice", notice=notice)

    def _silent(self):
        """The running process that stopped beating first, else None."""
        if not self.stall:
            return None
        if self._watch is None:
            self._watch = heartbeat.Watch(self.finished, self.stall, set(self.by_rank))
        silent = self._watch.silent()
        return silent if silent is not None and self.code(silent.rank) is None else None

    def stop(self):
        """Ends every process still running: SIGTERM, then SIGKILL after a grace."""
        for process in self:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + GRACE_SECONDS
        for process in self:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
