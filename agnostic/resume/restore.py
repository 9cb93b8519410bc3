"""Which backup a job resumes from, when its machines have disks of their own,
and whether what is read back is what was written.

Every process reads its own BackupAndRestore folder (the same path names a
different disk on each machine); they gather what each holds (epoch, step,
host, folder) through the engine's collectives, and the process holding the
newest backup sends its weights file's bytes to every other. At equal progress
the chief's backup wins, then the lowest rank's. A backup that cannot be read
where it is the newest stops every process with an error naming its host and
folder: a job never silently starts again from scratch, nor from an older
backup, while a newer one exists somewhere.

Nothing read back is trusted. The pointer is data, not a path: its entries
(the newest backup and the one before it) name a file of this folder by its
bare name, with whole numbers for epoch, step and size, and each records
the SHA-256 of the weights file as written and the model's variables (paths
and shapes). A hostile or garbled pointer stops the job, naming the folder
and the field. A weights file whose size or SHA-256 is not the one recorded
(a flipped bit, a truncation) is skipped with a warning naming it, and the
backup before it is used; where none verifies, the job stops naming the
folder. Bytes received from another process are checked against the
digest too.
"""
import collections
import hashlib
import json
import logging
import os
import re
import socket
import warnings

from agnostic import errors
from agnostic.resume import checkpoints

POINTER = "agnostic_backup.json"
logger = logging.getLogger("agnostic")

# `state`: the pointer's content (epoch, batch, weights file), None: no backup;
# `path`: the weights file to load here, or `data`: its bytes, from another
# process; `own`: what this process's folder held; `others_hold`: whether a
# process other than the chief held a backup (tidied at the end, see `forget`).
Found = collections.namedtuple("Found", "state path data own others_hold")
NOTHING = Found(None, None, None, None, False)


# A backup's weights file, by its bare name: backup-EPOCH-STEP.weights.h5.
WEIGHTS_NAME = re.compile(r"backup-[0-9]{6,}-[0-9]{6,}\.weights\.h5\Z")
SHA256 = re.compile(r"[0-9a-f]{64}\Z")


def entry(epoch, batch, folder, name, model):
    """The pointer's entry for the weights file `name` just written in
    `folder`: its progress, digest (read back from disk) and `model`'s
    variables."""
    return {"epoch": epoch, "batch": batch, "weights": name,
            **checkpoints.digest(os.path.join(folder, name)), "variables": variables(model)}


def variables(model):
    """[[path, shape], ...] of `model`'s variables, in its order."""
    return [[getattr(v, "path", v.name), [int(size) for size in v.shape]]
            for v in model.weights]


def problem(one):
    """What is wrong with a pointer's entry (its field and why), or None."""
    if not isinstance(one, dict):
        return f"an entry is {type(one).__name__}, not an object"
    name = one.get("weights")
    if not isinstance(name, str) or not WEIGHTS_NAME.match(name):
        return (f"field 'weights' is {name!r}, not the bare name of a backup file in this "
                "folder (backup-EPOCH-STEP.weights.h5)")
    for field in ("epoch", "batch", "size"):
        value = one.get(field)
        if type(value) is not int or value < 0:
            return f"field {field!r} is {value!r}, not a whole number of 0 or more"
    digest = one.get("sha256")
    if not isinstance(digest, str) or not SHA256.match(digest):
        return (f"field 'sha256' is {digest!r}, not a SHA-256 (a backup written by an "
                "agnostic older than its verification has none)")
    listed = one.get("variables")
    if not isinstance(listed, list) or not all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
            and isinstance(v[1], list) and all(type(n) is int for n in v[1]) for v in listed):
        return "field 'variables' is not a list of [path, shape]"
    return None


def verify(folder, one):
    """None where `one`'s weights file is on disk as it was written, else why not."""
    path = os.path.join(folder, one["weights"])
    try:
        found = checkpoints.digest(path)
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    if found["size"] != one["size"]:
        return f"{path} holds {found['size']} bytes where {one['size']} were written"
    if found["sha256"] != one["sha256"]:
        return f"{path} is not the file written: its SHA-256 differs from the one recorded"
    return None


def look(backup_dir):
    """What `backup_dir` holds here: host, folder, state (the newest entry
    that verifies; None: no backup), error (None: its weights file is
    verified) and skipped (entries that failed verification, why)."""
    held = {"host": socket.gethostname(), "folder": os.path.abspath(backup_dir),
            "state": None, "error": None, "skipped": []}
    pointer = os.path.join(backup_dir, POINTER)
    if not os.path.exists(pointer):
        return held
    try:
        checkpoints.check_file(pointer)
        with open(pointer) as handle:
            newest = json.load(handle)
    except (OSError, ValueError) as error:
        # Told to every process, never raised here alone: the others would wait.
        held["error"] = f"{type(error).__name__}: {error}"
        return held
    entries = [newest]
    if isinstance(newest, dict) and newest.get("previous") is not None:
        entries.append(newest["previous"])
    for one in entries:
        wrong = problem(one)
        if wrong:
            held["error"] = f"{POINTER} cannot be trusted: {wrong}"
            return held
    skipped = []
    for one in entries:
        why = verify(backup_dir, one)
        if why is None:
            held.update(state=_without_previous(one), skipped=skipped)
            return held
        skipped.append(f"the backup at epoch {one['epoch']}, step {one['batch']} ({why})")
    # None verifies: the newest, with why, so that choose() names the folder.
    held.update(state=_without_previous(newest), error="; ".join(skipped))
    return held


def _without_previous(one):
    return {key: value for key, value in one.items() if key != "previous"}


def last_good(backup_dir):
    """The newest entry of `backup_dir`'s pointer that verifies, or None."""
    held = look(backup_dir)
    return held["state"] if held["error"] is None else None


def progress(held):
    return (held["state"]["epoch"], held["state"].get("batch", 0))


def choose(held):
    """The rank whose backup every process restores, None when none holds one.
    Raises CheckpointError (the same on every process) when the newest
    backup, or one whose progress cannot be read, cannot be restored."""
    for rank, one in enumerate(held):
        if one["state"] is None and one["error"]:
            raise _unreadable(rank, one, "its pointer cannot be read or trusted")
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
        for number, one in enumerate(held):
            for skipped in one.get("skipped") or ():
                warnings.warn(
                    f"agnostic skipped {skipped}, in {one['folder']} on host {one['host']} "
                    f"(process {number}): it fails verification. Training resumes from "
                    f"epoch {progress(chosen)[0]}, step {progress(chosen)[1]}.",
                    UserWarning, stacklevel=2)
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
    if hashlib.sha256(sent["weights"]).hexdigest() != chosen["state"]["sha256"]:
        raise errors.CheckpointError(
            f"The backup weights process {source} (host {chosen['host']}) sent to process "
            f"{rank} are not the file it verified in {chosen['folder']}: their SHA-256 "
            "differs. Run again; if it recurs, check that link between the machines.")
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
    try:
        names = [POINTER] + [name for name in os.listdir(backup_dir)
                             if WEIGHTS_NAME.match(name)]
    except OSError:
        return
    for name in names:
        try:
            os.remove(os.path.join(backup_dir, name))
        except OSError:
            pass
