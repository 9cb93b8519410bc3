"""Heartbeats: each process of a group touches a file of its own every few
seconds, from a thread of its own, in a folder only the job's user can
open; a watcher names the process that went silent first. Who beats and who
watches whom: launch/stalls.py.

The thread runs while its process computes or waits in a collective, and
stops when the process stops (SIGSTOP, a frozen or swapping host), so the
first to go silent is the one that stopped: its peers, waiting for it, keep
beating. A watcher that was not running itself (the whole job stopped with
Ctrl-Z, a machine asleep) counts from when it runs again.
"""
import atexit
import dataclasses
import json
import logging
import os
import signal
import socket
import stat
import threading
import time

logger = logging.getLogger("agnostic")
STALL_VARIABLE = "AGNOSTIC_STALL_SECONDS"
PREFIX = "beat_"
VERDICT = "verdict"


def interval(seconds):
    """How often a process beats, and a watcher looks."""
    return max(0.05, min(2.0, seconds / 10))


@dataclasses.dataclass(frozen=True)
class Silent:
    """A process that has not beaten for `seconds`."""

    rank: int
    pid: int
    host: str
    seconds: float

    def summary(self, limit):
        return (f"stopped answering on host {self.host}: no heartbeat for "
                f"{self.seconds:.0f} s ({STALL_VARIABLE}={limit:g})")


class Beat:
    """This process's heartbeat in `folder`, until it exits; `shared`: the
    folder is the peers' own (torchrun's), the last out removes it."""

    def __init__(self, folder, rank, seconds, shared=False):
        self.pid, self.folder, self.shared = os.getpid(), folder, shared
        self.path = os.path.join(folder, f"{PREFIX}{rank}")
        record = {"rank": rank, "pid": self.pid, "host": socket.gethostname()}
        descriptor = os.open(self.path + ".part", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump(record, handle)
        os.replace(self.path + ".part", self.path)
        self.stopped = threading.Event()
        self.interval = interval(seconds)
        threading.Thread(target=self._run, name="agnostic-heartbeat", daemon=True).start()
        atexit.register(self.stop)

    def _run(self):
        while not self.stopped.wait(self.interval):
            try:
                os.utime(self.path)
            except OSError:  # the folder is gone: its launcher has ended
                return

    def stop(self):
        """No more beats; the file goes (not in a forked child's exit)."""
        self.stopped.set()
        if os.getpid() == self.pid:
            remove(self.path)
            if self.shared:
                try:
                    os.rmdir(self.folder)
                except OSError:  # a peer's heartbeat is still there
                    pass


class Watch:
    """Which process of `folder` (of `ranks`: all) went silent first."""

    def __init__(self, folder, seconds, ranks=None):
        self.folder, self.seconds, self.ranks = folder, seconds, ranks
        self.changed = {}  # rank -> (its file's mtime, when we saw it change)
        self.looked = None

    def silent(self):
        """The process silent for `seconds` or more the longest, else None."""
        now = time.monotonic()
        if self.looked is not None and now - self.looked > self.seconds / 2:
            # This watcher was not running either: count from now.
            self.changed = {rank: (mtime, now) for rank, (mtime, _) in self.changed.items()}
        self.looked = now
        quiet = []
        for rank in self._ranks():
            try:
                mtime = os.stat(os.path.join(self.folder, f"{PREFIX}{rank}")).st_mtime_ns
            except OSError:  # ended and gone
                self.changed.pop(rank, None)
                continue
            before = self.changed.get(rank)
            if before is None or before[0] != mtime:
                self.changed[rank] = (mtime, now)
            elif now - before[1] >= self.seconds:
                quiet.append((before[1], rank))
        for since, rank in sorted(quiet):
            record = read(self.folder, rank)
            if record is not None and alive(record["pid"]):
                return Silent(rank, record["pid"], record["host"], now - since)
        return None

    def _ranks(self):
        try:
            names = os.listdir(self.folder)
        except OSError:
            return []
        ranks = [int(name[len(PREFIX):]) for name in names
                 if name.startswith(PREFIX) and name[len(PREFIX):].isdigit()]
        return [rank for rank in ranks if self.ranks is None or rank in self.ranks]


def read(folder, rank):
    """A process's record, checked (None when it is not one)."""
    try:
        with open(os.path.join(folder, f"{PREFIX}{rank}"), encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    good = (isinstance(record, dict) and record.get("rank") == rank
            and type(record.get("pid")) is int and record["pid"] > 0
            and isinstance(record.get("host"), str) and record["host"].isprintable()
            and 0 < len(record["host"]) <= 255)
    if not good:
        logger.debug("agnostic: heartbeat file of rank %d in %s is not one; ignored.",
                     rank, folder)
    return record if good else None


def alive(pid):
    """Whether `pid` runs or is stopped (not gone, not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: not one of ours
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def end(silent):
    """Ends a silent process (SIGKILL: a stopped one takes no other)."""
    try:
        os.kill(silent.pid, signal.SIGKILL)
    except OSError:
        pass


def claim(folder):
    """Whether this process is the first of its peers to act on a silence."""
    try:
        os.close(os.open(os.path.join(folder, VERDICT), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                         0o600))
    except OSError:
        return False
    return True


def remove(path):
    try:
        os.remove(path)
    except OSError:
        pass


def private(folder):
    """Whether `folder` is a folder of this user's that no one else can open
    (else nothing is read from it or written there)."""

    try:
        status = os.lstat(folder)
    except OSError:
        return False
    good = (stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid()
            and not status.st_mode & 0o077)
    if not good:
        logger.warning("agnostic: %s is not a folder of this user's that only this user can "
                       "open; no heartbeat is kept there, so a stalled process is not named "
                       "(%s).", folder, STALL_VARIABLE)
    return good
