"""Which process of a group failed first in cause, with its traceback once.

When one process of a group fails, its peers fail soon after inside a
collective ("Connection closed by peer"): those are consequences, and a
script's bug that every process hits would print the same traceback once per
process. So each process that agnostic's launcher starts records its uncaught
exception in a report instead of printing it, saying whether the cause was
its own or a peer's end; the launcher names the process whose own failure
came first, shows its traceback once and sums up the others in a line each.
"""
import dataclasses
import json
import os
import signal
import sys
import time
import traceback

# The folder where a launched group's processes leave their reports.
REPORTS_VARIABLE = "AGNOSTIC_FAILURE_REPORTS"
# What the engines' collectives say when the process at the other end ended.
PEER_SIGNS = (
    "Connection closed by peer",
    "remote worker crashing",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
)


@dataclasses.dataclass(frozen=True)
class Failure:
    """How one process of the group ended."""

    rank: int
    own: bool  # its own exception or signal, not a dead peer's consequence
    summary: str  # one line
    details: str = ""  # the traceback
    time: float = 0.0


def caused_by_a_peer(error):
    """Whether `error` (or an error it was raised from) is a collective's
    report that the process at the other end has gone."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if any(sign in str(error) for sign in PEER_SIGNS):
            return True
        error = error.__cause__ or error.__context__
    return False


def from_exception(rank, kind, value, trace):
    summary = "".join(traceback.format_exception_only(kind, value)).strip().splitlines()
    return Failure(
        rank=rank, own=not caused_by_a_peer(value),
        summary=summary[-1] if summary else kind.__name__,
        details="".join(traceback.format_exception(kind, value, trace)),
        time=time.time(),
    )


def from_status(rank, status):
    """A process that ended without a report: killed by a signal, or exited
    before it joined the group (its own output says why)."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = str(-status)
        return Failure(rank, True, f"killed by signal {name}", time=time.time())
    return Failure(rank, True, f"exited with status {status}", time=time.time())


def install(rank, record):
    """Hands this process's uncaught exception to `record(failure)` instead
    of printing it; prints it after all if recording fails."""
    previous = sys.excepthook

    def hook(kind, value, trace):
        try:
            record(from_exception(rank, kind, value, trace))
        except Exception:  # the launcher cannot show it: show it here
            previous(kind, value, trace)

    sys.excepthook = hook


def write(folder, failure):
    """Leaves `failure` in `folder`, whole or not at all."""
    path = os.path.join(folder, f"rank_{failure.rank}.json")
    with open(path + ".part", "w") as handle:
        json.dump(dataclasses.asdict(failure), handle)
    os.replace(path + ".part", path)


def read(folder):
    """The reports in `folder`, by rank."""
    found = {}
    for name in os.listdir(folder):
        if name.startswith("rank_") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as handle:
                failure = Failure(**json.load(handle))
            found[failure.rank] = failure
    return found


def first_in_cause(failures):
    """The failure to name: the earliest of the processes' own failures, else
    the earliest of all."""
    own = [f for f in failures if f.own]
    return min(own or failures, key=lambda f: f.time)
