"""How both launchers count their processes' ends (agnostic/launch/processes.py),
with real processes: a failure, a preempted process, one aborted after it
finished its work, and the stop of one that ignores SIGTERM; and the one
supervisor that watches them for both."""
import os
import signal
import subprocess
import sys
import time

import pytest

from agnostic.resume import preemption
from agnostic.launch import processes
from tests.conftest import alive

pytestmark = pytest.mark.engine_free


def start(code, finished=None, **options):
    environment = dict(os.environ)
    if finished:
        environment[processes.FINISHED_VARIABLE] = str(finished)
    return subprocess.Popen([sys.executable, "-c", code], env=environment,
                            preexec_fn=processes.die_with_parent, **options)


def ended(group, seconds=30):
    deadline = time.monotonic() + seconds
    while not group.ended():
        assert time.monotonic() < deadline, "the processes did not end"
        time.sleep(0.05)
    return group


def test_a_status_other_than_zero_is_the_first_failure_by_rank():
    group = processes.Processes()
    group.add(3, start("import sys; sys.exit(0)"))
    group.add(5, start("import sys; sys.exit(7)"))
    group.add(6, start("import sys; sys.exit(9)"))
    ended(group)
    assert group.failed() == 5
    assert [group.code(rank) for rank in (3, 5, 6)] == [0, 7, 9]
    assert processes.exit_status(group.code(5)) == 7


def test_every_process_ending_well_is_no_failure():
    group = processes.Processes()
    for rank in range(2):
        group.add(rank, start("pass"))
    ended(group)
    assert group.failed() is None


def test_a_preempted_status_is_no_failure_and_a_forwarded_kill_is_none_either():
    group = processes.Processes()
    group.add(0, start(f"import sys; sys.exit({preemption.status(signal.SIGTERM)})"))
    group.add(1, start("import time; time.sleep(60)"))
    group.by_rank[0].wait()
    group.send(signal.SIGTERM)  # to the one running, killed by it: -15
    ended(group)
    assert group.code(0) == 128 + signal.SIGTERM  # a preempted process's own end
    assert group.code(1) == -signal.SIGTERM
    assert group.failed(preempted=signal.SIGTERM) is None
    # Without the run being preempted, a process killed by SIGTERM failed.
    assert group.failed() == 1


def test_killed_after_it_finished_counts_as_finished_and_before_as_a_failure(tmp_path):
    mark = ("import os, signal; from agnostic.launch import processes; "
            "processes.mark_finished(1); os.kill(os.getpid(), signal.SIGABRT)")
    group = processes.Processes(str(tmp_path))
    group.add(1, start(mark, tmp_path))
    group.add(2, start("import os, signal; os.kill(os.getpid(), signal.SIGABRT)", tmp_path))
    ended(group)
    assert group.by_rank[1].poll() == -signal.SIGABRT
    assert group.code(1) == 0
    assert group.code(2) == -signal.SIGABRT
    assert group.failed() == 2
    assert processes.exit_status(group.code(2)) == 1  # a signal's end: status 1


def test_stop_kills_a_process_that_ignores_sigterm_after_the_grace(monkeypatch):
    monkeypatch.setattr(processes, "GRACE_SECONDS", 0.5)
    group = processes.Processes()
    group.add(0, start("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                       "print('ready', flush=True); time.sleep(60)", stdout=subprocess.PIPE))
    group.add(1, start("import time; time.sleep(60)"))
    assert group.by_rank[0].stdout.readline() == b"ready\n"  # its handler is set
    began = time.monotonic()
    group.stop()
    assert group.ended()
    assert group.by_rank[0].poll() == -signal.SIGKILL
    assert group.by_rank[1].poll() == -signal.SIGTERM
    assert time.monotonic() - began < 10
    group.by_rank[0].stdout.close()


def test_the_kernel_ends_a_process_whose_launcher_died():
    launcher = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; from agnostic.launch import processes; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "preexec_fn=processes.die_with_parent); print(child.pid, flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    child = int(launcher.stdout.readline())
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not alive(child):
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    pytest.fail(f"process {child} outlived its launcher by 10 s")


def test_a_signal_for_some_ranks_reaches_them_alone():
    # `agnostic launch` passes a signal that came while it started its
    # processes on to each one started after it, once.
    group = processes.Processes()
    for rank in range(2):
        group.add(rank, start("import time; time.sleep(60)"))
    group.send(signal.SIGTERM, [1])
    assert group.by_rank[1].wait(timeout=30) == -signal.SIGTERM
    assert group.by_rank[0].poll() is None
    group.stop()
    assert group.by_rank[0].poll() == -signal.SIGTERM


def test_the_supervisor_returns_the_first_failure_the_end_or_a_notice():
    group = processes.Processes()
    group.add(0, start("import time; time.sleep(60)"))
    group.add(1, start("import sys; sys.exit(3)"))
    outcome = group.supervise()
    assert (outcome.kind, outcome.rank) == ("failed", 1)
    assert group.by_rank[0].poll() is None  # the launcher stops the others, not it
    group.stop()
    group = processes.Processes()
    group.add(0, start("pass"))
    assert group.supervise().kind == "ended"
    group = processes.Processes()
    group.add(0, start("import time; time.sleep(60)"))
    looks = []

    def wait(seconds):  # another node's launcher says something at the third look
        looks.append(seconds)
        return "node 1 failed" if len(looks) == 3 else None

    outcome = group.supervise(wait=wait)
    assert (outcome.kind, outcome.notice, looks) == ("notice", "node 1 failed",
                                                     [processes.POLL_SECONDS] * 3)
    group.stop()


def test_the_supervisor_ends_a_process_that_stopped_beating(tmp_path):
    beats = ("import sys, time; from agnostic.launch import heartbeat; "
             "heartbeat.Beat(sys.argv[1], 1, 2.0); time.sleep(120)")
    group = processes.Processes(str(tmp_path), stall=2.0)
    child = subprocess.Popen([sys.executable, "-c", beats, str(tmp_path)],
                             preexec_fn=processes.die_with_parent)
    group.add(1, child)
    deadline = time.monotonic() + 60
    while not (tmp_path / "beat_1").exists():
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    child.send_signal(signal.SIGSTOP)
    seen = []
    outcome = group.supervise(on_silent=lambda silent: seen.append(child.poll()))
    assert (outcome.kind, outcome.rank, outcome.silent.pid) == ("silent", 1, child.pid)
    assert seen == [None]  # told while it still ran, then killed
    assert child.wait(timeout=30) == -signal.SIGKILL
