"""The shim's torch workers start as torch is imported, import beside rank 0
and run the script at the compile line (agnostic/launch/early.py), training
as workers started at the compile line do; what is not needed runs nothing.
Real processes on simulated CPU devices (AGNOSTIC_CPU_DEVICES): 2, one
worker started early, where a test needs no more; 4 where it checks what
becomes of the workers a plan does not use."""
import glob
import json
import os
import subprocess
import sys

import numpy as np

from tests.conftest import ROOT, alive, engine_or_skip

keras = engine_or_skip()

SCRIPT = os.path.join("tests", "scripts", "early.py")


def run(folder, *arguments, module=False, devices=2, **variables):
    """The script started as users start it (`python early.py`, or `-m`),
    with the test's folder as its temp dir, on `devices` simulated CPU
    devices: (result, the records by rank)."""
    env = dict(os.environ, TMPDIR=str(folder), AGNOSTIC_CPU_DEVICES=str(devices),
               AGNOSTIC_START_EARLY="1")
    env.update(variables)
    start = ["-m", "tests.scripts.early"] if module else [SCRIPT]
    result = subprocess.run([sys.executable] + start + [str(folder)] + [str(a) for a in arguments],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    records = {}
    for path in glob.glob(os.path.join(str(folder), "rank_*.json")):
        with open(path) as handle:
            records[int(path.rsplit("_", 1)[1].split(".")[0])] = json.load(handle)
    return result, records


def weights(record):
    return [np.array(w) for w in record["weights"]]


def test_workers_start_with_torch_and_train_as_those_started_at_the_compile_line(tmp_path):
    (tmp_path / "early").mkdir()
    (tmp_path / "late").mkdir()
    result, early = run(tmp_path / "early", 2, module=True, devices=4)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(early) == [0, 1]
    # Rank 1 was started before rank 0 reached the compile line, waited, and
    # ran the module as __main__ with its arguments, in that process.
    assert early[1]["started"] < early[0]["compile"]
    assert early[1]["waited"] and early[1]["name"] == "__main__"
    assert early[1]["arguments"] == [str(tmp_path / "early"), "2"]
    # Of the 3 started for 4 devices, the one gpus=2 needs runs: the others
    # were stopped at the compile line.
    assert early[0]["children"] == [early[1]["pid"]]
    result, late = run(tmp_path / "late", 2, AGNOSTIC_START_EARLY="0", devices=4)
    assert result.returncode == 0, result.stderr[-3000:]
    assert late[1]["started"] > late[0]["compile"] and not late[1]["waited"]
    for a, b in zip(weights(early[0]), weights(late[0])):
        np.testing.assert_array_equal(a, b)
    assert not glob.glob(str(tmp_path / "*" / "agnostic-logs-*"))
    assert "[rank1]" not in result.stderr


def test_a_plan_of_one_process_runs_the_script_once(tmp_path):
    result, records = run(tmp_path, 1)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(records) == [0]
    assert records[0]["children"] == []  # stopped at the compile line
    assert "[rank" not in result.stderr
    assert not glob.glob(str(tmp_path / "agnostic-logs-*"))


def test_a_program_that_never_compiles_runs_once_and_leaves_nothing(tmp_path):
    result, records = run(tmp_path, 2, "no-compile", devices=4)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(records) == [0]
    waiting = records[0]["children"]
    assert len(waiting) == 3  # started as torch was imported, for 4 devices
    assert not any(alive(pid) for pid in waiting)
    assert result.stderr == ""
    assert not glob.glob(str(tmp_path / "agnostic-logs-*"))


def test_a_variable_read_at_import_set_after_the_start_starts_the_worker_afresh(tmp_path):
    result, records = run(tmp_path, 2, "set-after-import")
    assert result.returncode == 0, result.stderr[-3000:]
    # The same process, started early, ran the script as `python early.py`.
    assert records[1]["started"] < records[0]["compile"]
    assert not records[1]["waited"]
    assert records[1]["arguments"] == [str(tmp_path), "2", "set-after-import"]


def test_a_worker_failing_before_the_compile_line_is_named_with_its_own_traceback(tmp_path):
    result, records = run(tmp_path, 2, "raise")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "(rank 1 of 2)" in result.stderr
    shown = [line for line in result.stderr.splitlines() if line.startswith("[rank1]: ")]
    assert "[rank1]: ValueError: a mistake in rank 1's script" in shown
    assert any(SCRIPT in line for line in shown)
    assert not any("runpy" in line or "_waiting.py" in line for line in shown), shown


def test_a_process_forked_before_the_compile_line_holds_no_worker_back(tmp_path):
    # The fork holds a copy of every pipe rank 0 had open, its waiting
    # workers' too: a worker reading its message to the pipe's end would
    # wait for the fork, which waits for the training.
    result, records = run(tmp_path, 2, "fork", AGNOSTIC_JOIN_SECONDS="60")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(records) == [0, 1] and records[1]["waited"]
