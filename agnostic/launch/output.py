"""Where the standard output and error of launched processes go, as torchrun
does it:

- rank 0's reach the terminal as they are;
- every other rank's standard error reaches it too, each line prefixed with
  the rank (`[rank1]: ...`);
- every other rank's standard output is written to a log file, never thrown
  away: under --log-dir, else in a folder made in the system's temp dir,
  which is kept, and named at the end, only if a process wrote there (what
  the terminal did not show).

--log-dir DIR writes every stream of every process to files under DIR;
--tee 1 (or 3) shows the other ranks' standard output on the terminal too;
--local-ranks-filter 0,2 shows only those local ranks' output there (the
others' is in the files). A stream that both reaches the terminal and a file,
or carries a prefix, is read by a thread of the launcher line by line, so a
process writing a lot never blocks on a full pipe.
"""
import dataclasses
import os
import shlex
import subprocess
import tempfile
import threading
import time
from typing import FrozenSet, Optional

from agnostic import errors

STREAMS = ("stdout", "stderr")
# --tee: 1 standard output, 2 standard error (shown anyway), 3 both; 0 nothing more.
TEE_VALUES = ("0", "1", "2", "3")
TEMPORARY_PREFIX = "agnostic-logs-"
CLOSE_SECONDS = 5  # for the last lines once the processes have ended
# A line that starts with it goes to the log file only (a worker's warning
# that rank 0 shows: the mark _agnostic_hook.warnings_to_log writes).
LOG_ONLY = b"\x1eagnostic-log-only\x1e"


@dataclasses.dataclass(frozen=True)
class Output:
    """--log-dir, --tee and --local-ranks-filter, checked."""

    log_dir: Optional[str] = None
    tee: int = 0
    local_ranks: Optional[FrozenSet[int]] = None  # None: every local rank shown

    def shown(self, rank, local_rank, stream):
        """Whether `stream` of the process of `rank` reaches the terminal."""
        if self.local_ranks is not None and local_rank not in self.local_ranks:
            return False
        return rank == 0 or stream == "stderr" or bool(self.tee & 1)

    def filed(self, rank, local_rank, stream):
        """Whether `stream` is written to a file: under --log-dir always,
        else when it does not reach the terminal."""
        return self.log_dir is not None or not self.shown(rank, local_rank, stream)


def parse_tee(value):
    text = str(value).strip()
    if text not in TEE_VALUES:
        raise errors.LaunchError(
            "--tee must be 0, 1, 2 or 3: what every process also shows on the terminal "
            "besides its log files (1 standard output, 2 standard error, 3 both; only "
            "the whole node's value, not torchrun's per-rank form). "
            f"Received: --tee {shlex.quote(str(value))}")
    return int(text)


def parse_local_ranks(value, nproc):
    """--local-ranks-filter 0,2: a frozenset of local ranks, each below `nproc`."""
    parts = [part.strip() for part in str(value).split(",")]
    if all(part.isdigit() for part in parts):
        ranks = frozenset(int(part) for part in parts)
        if max(ranks) < nproc:
            return ranks
    raise errors.LaunchError(
        "--local-ranks-filter must list local ranks, from 0 to --nproc-per-node - 1 "
        f"({nproc - 1} here), separated by commas, such as --local-ranks-filter 0 or "
        "0,2: only their output is shown on the terminal (all of it stays in the log "
        f"files). Received: --local-ranks-filter {shlex.quote(str(value))}")


def check_log_dir(path):
    """--log-dir: made if missing; refused when it cannot hold files."""
    folder = os.path.abspath(os.path.expanduser(str(path)))
    try:
        os.makedirs(folder, exist_ok=True)
        usable = os.access(folder, os.W_OK | os.X_OK)
        reason = "this user cannot write there"
    except OSError as error:
        usable, reason = False, error.strerror or str(error)
    if not usable or not str(path).strip():
        raise errors.LaunchError(
            f"--log-dir must be a folder this user can write to (made if missing), "
            f"such as --log-dir ./logs; {folder} cannot be used ({reason}). "
            f"Received: --log-dir {shlex.quote(str(path))}")
    return folder


class Folder:
    """One run's log folder: under --log-dir, named as torchrun names its own
    (<rdzv-id>_<unique>); else made in the system's temp dir, and removed at
    the end if no process wrote anything there."""

    def __init__(self, output, run_id="none"):
        self.temporary = output.log_dir is None
        if self.temporary:
            self.path = tempfile.mkdtemp(prefix=TEMPORARY_PREFIX)
        else:
            self.path = tempfile.mkdtemp(prefix=f"{run_id}_", dir=output.log_dir)

    def notice(self, output, ranks, layout):
        """Under --log-dir, said at the start: where the output of `ranks`
        ((rank, local rank) pairs) is written; `layout`: the folders inside,
        such as rank_<r>."""
        filed = [rank for rank, local in ranks
                 if any(output.filed(rank, local, stream) for stream in STREAMS)]
        where = os.path.join(self.path, layout)
        return f"the output of {_ranks(filed)} is written to {where} (stdout.log, stderr.log)"

    def kept(self):
        """A temporary folder, once finished: the sentence naming what its
        processes wrote that the terminal did not show, or None where nothing
        was (the folder is then gone)."""
        if not self.temporary or not os.path.isdir(self.path):
            return None
        files = sorted(os.path.relpath(os.path.join(top, name), self.path)
                       for top, _, names in os.walk(self.path) for name in names)
        if not files:
            return None
        ranks = sorted({int(part[len("rank_"):]) for path in files
                        for part in path.split(os.sep) if part.startswith("rank_")})
        return (f"what the terminal did not show of the output of {_ranks(ranks)} is in "
                f"{self.path}: {', '.join(files)}")

    def finish(self):
        """A temporary folder: its empty files go, and the folder if nothing is left."""
        if not self.temporary:
            return
        for top, _, names in os.walk(self.path, topdown=False):
            for name in names:
                path = os.path.join(top, name)
                try:
                    if os.path.getsize(path) == 0:
                        os.remove(path)
                except OSError:
                    pass
            try:
                os.rmdir(top)  # only when empty
            except OSError:
                pass


def _ranks(ranks):
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]} to {ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def needs_folder(output, ranks):
    """Whether any stream of the processes `ranks` ((rank, local rank) pairs) goes to a file."""
    return any(output.filed(rank, local, stream) for rank, local in ranks for stream in STREAMS)


class _Console:
    """The launcher's own stdout or stderr, written a whole line at a time."""

    def __init__(self, descriptor):
        self.descriptor, self.lock, self.broken = descriptor, threading.Lock(), False

    def write(self, data):
        if self.broken:
            return
        with self.lock:
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(self.descriptor, view):]
            except OSError:  # closed (`| head`): the files still get everything
                self.broken = True


CONSOLES = {"stdout": _Console(1), "stderr": _Console(2)}


class Streams:
    """The files and reader threads of processes started together; `folder`:
    where their files go (None when none needs one)."""

    def __init__(self, output, folder=None):
        self.output, self.folder = output, folder
        self.threads = []

    def popen(self, rank, local_rank, command, **arguments):
        """subprocess.Popen(command, **arguments), its output sent where it belongs."""
        targets, opened, copies = {}, [], []
        for stream in STREAMS:
            shown = self.output.shown(rank, local_rank, stream)
            filed = self.output.filed(rank, local_rank, stream)
            prefix = b"" if rank == 0 else f"[rank{rank}]: ".encode()
            if shown and not filed and not prefix:
                targets[stream] = None  # the terminal, as it is
                continue
            file = open(self._path(rank, stream), "wb")
            opened.append(file)
            if shown:  # the terminal (prefixed unless rank 0), and the file: every
                # line where filed, else those marked for the log only
                targets[stream] = subprocess.PIPE
                copies.append((stream, file, prefix, not filed))
            else:
                targets[stream] = file
        try:
            process = subprocess.Popen(command, **targets, **arguments)
        except BaseException:
            for file in opened:
                file.close()
            raise
        for file in opened:  # the child holds its own copy
            if not any(file is copy[1] for copy in copies):
                file.close()
        for stream, file, prefix, hidden_only in copies:
            thread = threading.Thread(
                target=_copy, args=(getattr(process, stream), file, CONSOLES[stream], prefix,
                                    hidden_only),
                name=f"agnostic-{stream}-rank{rank}", daemon=True)
            thread.start()
            self.threads.append(thread)
        return process

    def _path(self, rank, stream):
        folder = os.path.join(self.folder, f"rank_{rank}")
        os.makedirs(folder, exist_ok=True)
        return os.path.join(folder, f"{stream}.log")

    def close(self, seconds=CLOSE_SECONDS):
        """Waits (at most `seconds`) for the last lines once the processes have
        ended; a pipe a grandchild still holds open is left to its thread."""
        deadline = time.monotonic() + seconds
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.threads = [thread for thread in self.threads if thread.is_alive()]


def _copy(pipe, file, console, prefix, hidden_only=False):
    """Line by line from `pipe` to `file` and the terminal, until the process
    ends; `hidden_only`: only the lines the terminal is not shown go to `file`."""
    with pipe, file:
        for line in iter(pipe.readline, b""):
            log_only = line.startswith(LOG_ONLY)
            if log_only:
                line = line[len(LOG_ONLY):]
            if file is not None and (log_only or not hidden_only):
                try:
                    file.write(line)
                    file.flush()
                except (OSError, ValueError):  # a full disk: the pipe is still drained
                    file = None
            if log_only:
                continue
            if prefix and not line.endswith(b"\n"):
                line += b"\n"
            console.write(prefix + line)
