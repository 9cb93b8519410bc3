"""Which backup a job resumes from when each process reads a disk of its own
(agnostic/resume/restore.py), without any engine: what each process found is given
here as the processes would gather it; tests/resume/test_backup_disks.py runs the
same with real processes on every engine."""
import json

import pytest

from agnostic import errors
from agnostic.resume import checkpoints, restore


def held(epoch=None, batch=0, error=None, host="node-a", folder="/backup"):
    state = None if epoch is None else {"epoch": epoch, "batch": batch,
                                        "weights": f"backup-{epoch:06d}-{batch:06d}.weights.h5"}
    return {"host": host, "folder": folder, "state": state, "error": error}


def test_the_newest_backup_wins_and_the_chiefs_at_equal_progress():
    assert restore.choose([held(), held()]) is None  # nothing anywhere: a fresh start
    assert restore.choose([held(), held(6)]) == 1  # the old chief's disk, now rank 1
    assert restore.choose([held(2), held(6), held(4)]) == 1
    assert restore.choose([held(2, 5), held(2, 3)]) == 0  # steps count inside an epoch
    assert restore.choose([held(6), held(6), held(5)]) == 0  # equal: the chief's
    assert restore.choose([held(), held(6), held(6)]) == 1  # equal: the lowest rank's
    # Broken but at equal progress: another copy of the same point will do.
    assert restore.choose([held(6, error="truncated"), held(6)]) == 1
    # Broken and older than another: the newer is restored.
    assert restore.choose([held(2, error="truncated"), held(6)]) == 1


def test_a_newest_backup_that_cannot_be_read_stops_the_job_naming_where_it_is():
    chosen = [held(2, host="node-a"), held(6, error="CheckpointError: truncated",
                                           host="node-b", folder="/disk/b/backup")]
    with pytest.raises(errors.CheckpointError, match=r"The backup in /disk/b/backup on host "
                       r"node-b \(process 1\) may be the newest of this job, but its weights "
                       r"cannot be read \(CheckpointError: truncated\)"):
        restore.choose(chosen)
    unknown = [held(6), held(error="JSONDecodeError: ...", host="node-c", folder="/c")]
    with pytest.raises(errors.CheckpointError, match=r"/c on host node-c \(process 1\).* "
                       "its pointer cannot be read or trusted"):
        restore.choose(unknown)


def test_each_process_reads_its_own_folder(tmp_path):
    assert restore.look(str(tmp_path))["state"] is None
    name = "backup-000003-000000.weights.h5"
    (tmp_path / name).write_bytes(b"the weights")
    state = {"epoch": 3, "batch": 0, "weights": name, "variables": [["dense/kernel", [2, 1]]],
             **checkpoints.digest(tmp_path / name)}
    (tmp_path / restore.POINTER).write_text(json.dumps(state))
    found = restore.look(str(tmp_path))
    assert found["state"] == state and found["folder"] == str(tmp_path)
    assert found["error"] is None
    (tmp_path / name).unlink()
    found = restore.look(str(tmp_path))
    assert found["state"] == state
    assert "No such file" in found["error"]  # the pointer names a missing file
    (tmp_path / restore.POINTER).write_text("{")
    found = restore.look(str(tmp_path))
    assert found["state"] is None and "truncated or corrupt" in found["error"]
