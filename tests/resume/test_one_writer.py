"""Atomic replacement of a file without any engine: writers that never take
each other's temporary files, left-overs removed only when provably stale,
and a write that fails on a real OS limit (a file size limit standing in for
a full disk) leaving the previous file whole."""
import json
import os
import subprocess
import sys

import pytest

from agnostic import errors
from agnostic.resume import checkpoints
from tests.conftest import ROOT

# Writes PATH TIMES times, each a JSON document of a few hundred kB written
# in pieces (long enough for the two writers' writes to overlap); prints the
# number of failed saves and their errors.
WRITER = """
import json, os, sys
from agnostic.resume import checkpoints

path, times, mark = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def write(temporary):
    with open(temporary, "w") as handle:
        handle.write('{"writer": "%s", "rows": [' % mark)
        for row in range(2000):
            handle.write(("," if row else "") + json.dumps(list(range(20))))
            if row % 200 == 0:
                handle.flush()
        handle.write("]}")

failures = []
for _ in range(times):
    try:
        checkpoints.replace_atomically(path, write)
    except Exception as error:
        failures.append(repr(error))
print(json.dumps(failures[:3] + [len(failures)]))
"""


def start_writer(path, mark, times=50):
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(times), mark],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_two_processes_saving_one_path_lose_no_save(tmp_path):
    path = tmp_path / "shared.json"
    writers = [start_writer(path, mark) for mark in ("a", "b")]
    outputs = [writer.communicate(timeout=120) for writer in writers]
    for writer, (out, err) in zip(writers, outputs):
        assert writer.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])[-1] == 0, out  # no failed save
    checkpoints.check_file(str(path))
    assert json.loads(path.read_text())["writer"] in ("a", "b")  # the last rename's
    assert os.listdir(tmp_path) == ["shared.json"]  # each removed what it left


def test_only_provably_stale_left_overs_are_removed(tmp_path):
    path = tmp_path / "model.json"
    name = path.name
    host = checkpoints._host()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid no process has now (reused within the test: unlikely)
    names = {
        "dead writer here": checkpoints.TEMPORARY.format(
            host=host, pid=dead.pid, thread=1, token="0" * 8, name=name),
        "live writer here": checkpoints.TEMPORARY.format(
            host=host, pid=os.getppid(), thread=1, token="1" * 8, name=name),
        "other machine": checkpoints.TEMPORARY.format(
            host="f" * 8, pid=dead.pid, thread=1, token="2" * 8, name=name),
        "other machine, untouched for long": checkpoints.TEMPORARY.format(
            host="e" * 8, pid=dead.pid, thread=1, token="3" * 8, name=name),
        "another target": checkpoints.TEMPORARY.format(
            host=host, pid=dead.pid, thread=1, token="4" * 8, name="other.json"),
    }
    for label, temporary in names.items():
        (tmp_path / temporary).write_text(label)
    old = os.stat(tmp_path / names["other machine"]).st_mtime - checkpoints.STALE_SECONDS - 60
    os.utime(tmp_path / names["other machine, untouched for long"], (old, old))
    checkpoints.replace_atomically(str(path), lambda t: open(t, "w").write("{}"))
    left = set(os.listdir(tmp_path))
    assert names["dead writer here"] not in left
    assert names["other machine, untouched for long"] not in left
    assert {names["live writer here"], names["other machine"], names["another target"],
            name} <= left


FULL_DISK = """
import json, os, resource, signal, sys
from agnostic import errors
from agnostic.resume import checkpoints

path = sys.argv[1]
checkpoints.replace_atomically(path, lambda t: open(t, "w").write(json.dumps({"good": 1})))
# Beyond this size a write fails with EFBIG, as on a full disk (ENOSPC).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    checkpoints.replace_atomically(path, lambda t: open(t, "w").write("x" * 100000))
except errors.CheckpointError as error:
    print(json.dumps({"error": str(error), "cause": type(error.__cause__).__name__}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_failed_write_names_the_file_and_keeps_the_last_good_one(tmp_path):
    path = tmp_path / "state.json"
    run = subprocess.run([sys.executable, "-c", FULL_DISK, str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["error"].startswith(f"Could not write {path}: [Errno 27] File too large")
    assert "is unchanged" in result["error"] and result["cause"] == "OSError"
    assert json.loads(path.read_text()) == {"good": 1}
    assert os.listdir(tmp_path) == [path.name]  # its temporary file removed
    assert issubclass(errors.CheckpointError, OSError)  # `except OSError` still catches it
