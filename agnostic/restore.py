"""Which backup a job resumes from, when its machines have disks of their own.

Every process reads its own BackupAndRestore folder (the same path names a
different disk on each machine); they gather what each holds (epoch, step,
host, folder) through the engine's collectives, and the process holding the
newest backup sends its weights file's bytes to every other. At equal progress
the chief's backup wins, then the lowest rank's. A backup that cannot be read
where it is the newest stops every process with an error naming its host and
folder: a job never silently starts again from scratch, nor from an older
backup, while a newer one exists somewhere.
"""
import collections
import json
import logging
import os
import socket

from agnostic import checkpoints, errors

POINTER = "agnostic_backup.json"
logger = logging.getLogger("agnostic")

# `state`: the pointer's content (epoch, batch, weights file), None: no backup;
# `path`: the weights file to load here, or `data`: its bytes, from another
# process; `own`: what this process's folder held; `others_hold`: whether a
# process other than the chief held a backup (tidied at the end, see `forget`).
Found = collections.namedtuple("Found", "state path data own others_hold")
NOTHING = Found(None, None, None, None, False)


def look(backup_dir):
    """What `backup_dir` holds here: host, folder, state (None: no backup)
    and error (None: its weights file is complete)."""
    held = {"host": socket.gethostname(), "folder": os.path.abspath(backup_dir),
            "state": None, "error": None}
    pointer = os.path.join(backup_dir, POINTER)
    if not os.path.exists(pointer):
        return held
    try:
        checkpoints.check_file(pointer)
        with open(pointer) as handle:
            state = json.load(handle)
        weights = state["weights"]
        int(state["epoch"]), int(state.get("batch", 0))  # numbers, or an error here
    except (OSError, KeyError, TypeError, ValueError, AttributeError) as error:
        # Told to every process, never raised here alone: the others would wait.
        held["error"] = f"{type(error).__name__}: {error}"
        return held
    held["state"] = state
    try:
        checkpoints.check_file(os.path.join(backup_dir, weights))
    except (OSError, ValueError) as error:
        held["error"] = f"{type(error).__name__}: {error}"
    return held


def progress(held):
    return (held["state"]["epoch"], held["state"].get("batch", 0))


def choose(held):
    """The rank whose backup every process restores, None when none holds one.
    Raises CheckpointError (the same on every process) when the newest
    backup, or one whose progress cannot be read, cannot be restored."""
    for rank, one in enumerate(held):
        if one["state"] is None and one["error"]:
            raise _unreadable(rank, one, "its epoch cannot be read")
    holders = [rank for rank, one in enumerate(held) if one["state"] is not None]
    if not holders:
        return None
    newest = max(progress(held[rank]) for rank in holders)
    at_newest = [rank for rank in holders if progress(held[rank]) == newest]
    intact = [rank for rank in at_newest if not held[rank]["error"]]
    if not intact:
        raise _unreadable(at_newest[0], held[at_newest[0]], "its weights cannot be read")
    return intact[0]  # the chief's (rank 0) when it holds the newest


def _unreadable(rank, held, why):
    return errors.CheckpointError(
        f"The backup in {held['folder']} on host {held['host']} (process {rank}) may be "
        f"the newest of this job, but {why} ({held['error']}), so training would start "
        "from an older point. Repair or remove that folder on that host, or copy a "
        "complete backup into it, then run again."
    )


def newest(backup_dir, share):
    """The newest backup of any process, the same on every process (`share`:
    the model's, None with one process); NOTHING when none holds one."""
    own = look(backup_dir)
    held = [own] if share is None else share.gather(own)
    rank = 0 if share is None else share.rank()
    source = choose(held)
    others_hold = any(one["state"] is not None for one in held[1:])
    if source is None:
        return NOTHING
    chosen = held[source]
    if rank == 0:
        logger.info("BackupAndRestore resumes at epoch %d, step %d, from the backup in "
                    "%s on host %s (process %d of %d).", *progress(chosen),
                    chosen["folder"], chosen["host"], source, len(held))
    path = os.path.join(backup_dir, chosen["state"]["weights"])
    if share is None:
        return Found(chosen["state"], path, None, own["state"], others_hold)
    sent = share(_weights(path, chosen) if rank == source else None, source=source)
    if "error" in sent:  # raised on every process, not the source alone
        raise errors.CheckpointError(sent["error"])
    if rank == source:
        return Found(chosen["state"], path, None, own["state"], others_hold)
    return Found(chosen["state"], None, sent["weights"], own["state"], others_hold)


def _weights(path, chosen):
    try:
        with open(path, "rb") as handle:
            return {"weights": handle.read()}
    except OSError as error:
        return {"error": (f"The newest backup of this job, {path} on host "
                          f"{chosen['host']}, could not be read ({error}). Make it readable "
                          "there, then run again.")}


def forget(backup_dir, share, found, is_chief):
    """At the end of a fit that deletes its backup: a backup another process
    held in its own folder at the start, still as it was, is removed too, so
    that the next fit does not resume from it. Every process first waits for
    the chief's last save (on a shared disk, that backup is the chief's)."""
    if not found.others_hold:
        return
    if share is not None:
        share(None)  # a barrier: the chief has written its last backup
    if is_chief or found.own is None or look(backup_dir)["state"] != found.own:
        return
    for name in (POINTER, found.own["weights"]):
        try:
            os.remove(os.path.join(backup_dir, name))
        except OSError:
            pass
