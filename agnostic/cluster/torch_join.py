"""torch's processes meet in a store of agnostic's making, within a bound.

torch's own rendezvous (init_method tcp://) listens on every interface and
waits 10 minutes for a missing peer without naming it. Here rank 0 makes
the TCPStore on a socket bound to the job's address (cluster.listen), every
rank writes "joined/<rank>", and rank 0 waits AGNOSTIC_JOIN_SECONDS for all of
them, then writes the outcome, which the others read: every process ends
with the same message naming the missing ranks. The process group is then
made on that store.

Under torchrun with the agent's store (TORCHELASTIC_USE_AGENT_STORE=True)
the store is the agent's, on its port: the ranks join it there.
"""
import datetime
import os
import socket
import time

from agnostic import errors
from agnostic.cluster import listen

_LISTENERS = []  # the sockets the stores listen on, open while they live
READY = "ready"


def store(group, seconds):
    """The store of `group` (a cluster.Environment) once every rank has
    joined it; LaunchError naming the missing ranks after `seconds`."""
    import torch.distributed as dist

    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "") == "True"
    host, port, rank, size = group.coordinator, group.port, group.rank, group.world_size
    timeout = datetime.timedelta(seconds=seconds)
    began = time.monotonic()
    try:
        if rank == 0 and not agent:
            listener = listen.listen_socket(listen.rank_0(group), port)
            _LISTENERS.append(listener)
            made = dist.TCPStore(host, port, size, True, timeout, wait_for_workers=False,
                                 master_listen_fd=listener.fileno(), use_libuv=True)
        else:
            # Rank 0's port is awaited here: torch's own wait fills stderr.
            _await_port(host, port, began + seconds)
            left = max(1.0, began + seconds - time.monotonic())
            made = dist.TCPStore(host, port, size, False, datetime.timedelta(seconds=left))
    except (RuntimeError, OSError) as error:  # torch's DistStoreError is a RuntimeError
        raise errors.LaunchError(
            f"Rank {rank} of {size} ({group.name}) could not reach rank 0 at "
            f"{host}:{port} within {seconds} s ({_first_line(error)}). Start rank 0 (it "
            "listens there), check the address and that the port is open between the "
            "machines, or set AGNOSTIC_JOIN_SECONDS to wait longer.") from error
    prefix = f"agnostic/joined/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    made.set(f"{prefix}{rank}", "1")
    if rank == 0:
        missing = _wait_for_ranks(made, prefix, size, began + seconds)
        made.set(prefix + READY, ",".join(map(str, missing)) or "all")
    else:
        missing = _outcome(made, prefix, group, seconds, began)
    if missing:
        raise errors.LaunchError(
            f"{_ranks(missing)} of the {size} processes ({group.name}) did not join rank 0 "
            f"at {host}:{port} within {seconds} s, so nothing was trained. Start every "
            "process (each with its own RANK), check that they name the same address "
            "and port, or set AGNOSTIC_JOIN_SECONDS to wait longer.")
    return made


def _await_port(host, port, deadline):
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise OSError(f"nothing answers there: {error}") from error
            time.sleep(0.1)


def _wait_for_ranks(made, prefix, size, deadline):
    keys = [f"{prefix}{r}" for r in range(size)]
    while True:
        missing = [r for r, key in enumerate(keys) if not made.check([key])]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def _outcome(made, prefix, group, seconds, began):
    """Rank 0's word: the missing ranks (none: []); it gives it within the
    bound, and a little slack is allowed for the clocks' start."""
    try:
        made.wait([prefix + READY], datetime.timedelta(
            seconds=max(1.0, seconds + 10 - (time.monotonic() - began))))
        said = made.get(prefix + READY).decode()
    except (RuntimeError, OSError) as error:
        raise errors.LaunchError(
            f"Rank {group.rank} of {group.world_size} ({group.name}) joined rank 0 at "
            f"{group.coordinator}:{group.port}, but rank 0 did not say within {seconds} s "
            f"that every process had joined ({_first_line(error)}); it may have ended. "
            "See rank 0's output.") from error
    return [] if said == "all" else [int(r) for r in said.split(",")]


def _ranks(missing):
    shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
    return f"Rank {shown}" if len(missing) == 1 else f"Ranks {shown}"


def _first_line(error):
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
