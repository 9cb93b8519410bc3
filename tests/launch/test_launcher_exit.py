"""How the shim's own launcher ends (no engine needed: a plain script that
starts its second process through agnostic.launch.local): a worker slower
than rank 0 is waited for, or stopped after AGNOSTIC_EXIT_SECONDS without
failing the run; a worker that fails late fails it; SIGTERM reaches the
worker; bad settings are refused; the reports folder is never left behind."""
import os
import signal
import subprocess
import sys
import time

import pytest

from agnostic import errors
from agnostic.resume import preemption
from agnostic.launch import local
from tests.conftest import ROOT

# Bounds in seconds: run alone, not beside other tests (tox: -m serial);
# no engine in any process (tests/conftest.py: where it runs).
pytestmark = [pytest.mark.serial, pytest.mark.engine_free]

SCRIPT = os.path.join("tests", "scripts", "launcher_exit.py")


def start(folder, mode, *extra, **variables):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", local.EXIT_VARIABLE,
                        preemption.VARIABLE)}
    env.update(TMPDIR=str(folder), **variables)
    return subprocess.Popen([sys.executable, SCRIPT, str(folder), mode] + list(extra),
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(process):
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        # Said before the processes are ended: how each handles, blocks and
        # has pending each signal (Linux), to find why one was not acted on.
        states = signal_states(process.pid)
        process.kill()
        process.communicate()
        pytest.fail(f"the launcher did not end within 60 s; its processes' signals:\n{states}")
    return process.returncode, err


def signal_states(pid):
    """The Sig* lines of /proc/PID/status for `pid` and its descendants."""
    lines, pending = [], [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                said = [line.strip() for line in status if line.startswith(("Sig", "Shd"))]
            lines.append(f"{current}: {' '.join(said)}")
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    pending.extend(int(child) for child in children.read().split())
        except OSError as error:
            lines.append(f"{current}: {error}")
    return "\n".join(lines)


def leftovers(folder):
    return [name for name in os.listdir(folder) if name.startswith("agnostic-")]


def test_a_slow_worker_is_waited_for_or_stopped_after_the_bound_without_failing(tmp_path):
    waited, bounded = tmp_path / "waited", tmp_path / "bounded"
    waited.mkdir(), bounded.mkdir()
    first = start(waited, "slow", "2")
    began = time.monotonic()
    second = start(bounded, "slow", "30", AGNOSTIC_EXIT_SECONDS="1")
    code, err = finish(first)
    assert code == 0, err
    assert (waited / "worker-done").exists()  # rank 0 waited: it wrote its file
    code, err = finish(second)
    assert code == 0, err  # rank 0 ended well; the slow worker is no failure
    assert time.monotonic() - began < 20
    assert not (bounded / "worker-done").exists()
    assert "still running 1 s later (AGNOSTIC_EXIT_SECONDS) are stopped now" in err
    assert leftovers(waited) == leftovers(bounded) == []


def test_a_worker_that_fails_after_rank_0_fails_the_run(tmp_path):
    code, err = finish(start(tmp_path, "fail-late"))
    assert code == 3, err
    assert leftovers(tmp_path) == []


def test_sigterm_to_rank_0_reaches_the_worker_and_leaves_nothing(tmp_path):
    process = start(tmp_path, "term")
    deadline = time.monotonic() + 30
    while not (tmp_path / "worker-ready").exists():
        assert process.poll() is None and time.monotonic() < deadline, finish(process)
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    code, err = finish(process)
    assert code == 128 + signal.SIGTERM, err
    assert (tmp_path / "worker-signalled").exists()
    assert leftovers(tmp_path) == []


def test_agnostic_launch_passes_the_chosen_signal_on_to_every_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(TMPDIR=str(tmp_path), AGNOSTIC_PREEMPT_SIGNAL="USR1")
    process = subprocess.Popen(
        [sys.executable, "-m", "agnostic", "launch", "--standalone", "--nproc-per-node", "2",
         SCRIPT, str(tmp_path), "launched"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"ready-{rank}").exists() for rank in (0, 1)):
        assert process.poll() is None and time.monotonic() < deadline, finish(process)
        time.sleep(0.02)
    process.send_signal(signal.SIGUSR1)
    code, err = finish(process)
    # Both processes got it and ended as preempted: the node's status says so.
    assert code == 128 + signal.SIGUSR1, err
    assert all((tmp_path / f"signalled-{rank}").exists() for rank in (0, 1))
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("value", ["KILL", "sigstop", "NOPE", "0", "-1", "USR1@90"])
def test_a_bad_preempt_signal_is_refused(monkeypatch, value):
    monkeypatch.setenv(preemption.VARIABLE, value)
    with pytest.raises(errors.PreemptionSettingError,
                       match=f"Received: AGNOSTIC_PREEMPT_SIGNAL={value!r}"):
        preemption.signals()


@pytest.mark.parametrize("value,number", [("USR1", signal.SIGUSR1), ("sigusr2", signal.SIGUSR2),
                                          ("10", 10), ("TERM", signal.SIGTERM)])
def test_a_preempt_signal_by_name_or_number(monkeypatch, value, number):
    monkeypatch.setenv(preemption.VARIABLE, value)
    assert preemption.signals()[-1] == number and signal.SIGTERM in preemption.signals()


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf"])
def test_a_bad_exit_bound_is_refused(monkeypatch, value):
    monkeypatch.setenv(local.EXIT_VARIABLE, value)
    with pytest.raises(errors.PreemptionSettingError,
                       match=f"Received: AGNOSTIC_EXIT_SECONDS={value!r}"):
        local.exit_seconds()
