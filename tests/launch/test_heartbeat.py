"""Heartbeats and their watch with real processes and real signals; no
engine (tests/launch/test_stalls.py stops a rank of each launcher)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from agnostic import errors
from agnostic.launch import heartbeat, stalls
from tests.conftest import ROOT

pytestmark = pytest.mark.engine_free

BEATS = """import sys, time
from agnostic.launch import heartbeat, stalls
heartbeat.Beat(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
time.sleep(600)
"""


@pytest.fixture
def beating(tmp_path):
    """Starts a process that beats as rank 1 in a private folder."""
    folder = tmp_path / "beats"
    folder.mkdir(mode=0o700)
    started = []

    def start(seconds):
        process = subprocess.Popen([sys.executable, "-c", BEATS, str(folder), "1", str(seconds)],
                                   cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
        started.append(process)
        path = folder / "beat_1"
        deadline = time.monotonic() + 60
        while not path.exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        return process, str(folder)

    yield start
    for process in started:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()


def first_silent(watch, seconds):
    """(what the watch names, after how long), looking as a launcher does."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        silent = watch.silent()
        if silent is not None:
            return silent, time.monotonic() - began
        time.sleep(0.05)
    return None, seconds


# The bound of these tests: short, with room for a loaded machine.
SECONDS = 2.0


def test_a_stopped_process_is_named_within_the_bound_and_a_running_one_never(beating):
    process, folder = beating(SECONDS)
    watch = heartbeat.Watch(folder, SECONDS)
    silent, _ = first_silent(watch, 2 * SECONDS)
    assert silent is None  # it runs: it beats
    process.send_signal(signal.SIGSTOP)
    silent, after = first_silent(watch, 10 * SECONDS)
    assert silent is not None and 0.9 * SECONDS <= after < 2 * SECONDS
    assert (silent.rank, silent.pid) == (1, process.pid)
    assert silent.host and "stopped answering on host" in silent.summary(SECONDS)
    assert "AGNOSTIC_STALL_SECONDS=2" in silent.summary(SECONDS)
    process.send_signal(signal.SIGCONT)  # it runs again: no longer silent
    time.sleep(SECONDS / 2)
    assert first_silent(watch, SECONDS)[0] is None


def test_a_watcher_that_was_stopped_too_counts_from_when_it_runs_again(beating):
    """The whole job stopped (Ctrl-Z), then resumed: nobody is named at once."""
    process, folder = beating(SECONDS)
    watch = heartbeat.Watch(folder, SECONDS)
    assert watch.silent() is None
    process.send_signal(signal.SIGSTOP)
    time.sleep(1.5 * SECONDS)  # the watcher did not look either
    assert watch.silent() is None
    silent, after = first_silent(watch, 10 * SECONDS)
    assert silent is not None and silent.pid == process.pid
    assert 0.9 * SECONDS <= after < 2 * SECONDS


def test_an_ended_process_is_not_named(beating):
    process, folder = beating(SECONDS)
    watch = heartbeat.Watch(folder, SECONDS)
    assert watch.silent() is None
    process.kill()  # its file stays (no exit hooks); the process is gone
    process.wait()
    assert first_silent(watch, 2 * SECONDS)[0] is None


def test_the_first_of_the_peers_claims_the_verdict(tmp_path):
    assert heartbeat.claim(str(tmp_path))
    assert not heartbeat.claim(str(tmp_path))


def test_a_file_that_is_not_a_record_is_not_read(tmp_path):
    for text in ('["not", "a", "record"]', '{"rank": 2, "pid": 1, "host": "h"}',
                 '{"rank": 1, "pid": -5, "host": "h"}', '{"rank": 1, "pid": 1, "host": "a\\nb"}',
                 "{truncated"):
        (tmp_path / "beat_1").write_text(text)
        assert heartbeat.read(str(tmp_path), 1) is None, text
    (tmp_path / "beat_1").write_text('{"rank": 1, "pid": 7, "host": "node-3"}')
    assert heartbeat.read(str(tmp_path), 1) == {"rank": 1, "pid": 7, "host": "node-3"}


def test_a_folder_others_can_open_is_not_used(tmp_path, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    assert not heartbeat.private(str(shared))
    assert f"{shared} is not a folder of this user's" in caplog.text
    shared.chmod(0o700)
    assert heartbeat.private(str(shared))
    link = tmp_path / "link"
    link.symlink_to(shared)
    assert not heartbeat.private(str(link))


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan"])
def test_a_stall_bound_that_is_not_seconds_is_refused(value):
    with pytest.raises(errors.LaunchError,
                       match=f"AGNOSTIC_STALL_SECONDS must be a number of seconds.*"
                             f"Received: AGNOSTIC_STALL_SECONDS='{value}'"):
        stalls.stall_seconds({"AGNOSTIC_STALL_SECONDS": value})
    assert stalls.stall_seconds({}) == 60
    assert stalls.stall_seconds({"AGNOSTIC_STALL_SECONDS": "0"}) == 0
    assert stalls.stall_seconds({"AGNOSTIC_STALL_SECONDS": " 2.5 "}) == 2.5


def test_a_heartbeat_that_cannot_be_kept_is_said_and_never_raised(tmp_path, monkeypatch,
                                                                   caplog):
    """stalls.start runs as the engine is imported: it must not fail the import."""
    from agnostic import cluster

    group = cluster.Environment("agnostic-launch", 2, 1)
    folder = tmp_path / "beats"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(stalls, "_started", [])
    monkeypatch.setenv(stalls.FOLDER_VARIABLE, str(folder))

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(heartbeat, "Beat", no_space)
    stalls.start(group)
    assert "no heartbeat for this process" in caplog.text and "No space left" in caplog.text
    assert stalls._started == [] and os.listdir(folder) == []
