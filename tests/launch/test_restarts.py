"""--max-restarts: when a process fails, every process of the node is
stopped and started again, up to N times, each restart said on stderr with
the rank that failed and the attempt; used up, the node's status is the
failing process's. Real launches of a script that imports no engine."""
import glob
import os
import signal
import time

import pytest

from tests.launch.launching import launch, read, start

# Starts no engine in any process (tests/conftest.py: where it runs).
pytestmark = pytest.mark.engine_free

# Rank 1 fails (status 3) on the attempts FOLDER/fail says, or on the first
# only when that file is absent; every process leaves FOLDER/started-RANK-ATTEMPT.
FLAKY = """import os, sys, time
folder = sys.argv[1]
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
open(os.path.join(folder, f"started-{rank}-{attempt}"), "w").close()
print(f"rank {rank} attempt {attempt} of {1 + int(os.environ['TORCHELASTIC_MAX_RESTARTS'])}",
      flush=True)  # a process stopped mid-run loses what it had not flushed
failing = os.path.join(folder, "fail")
fails = open(failing).read().split() if os.path.exists(failing) else ["0"]
if rank == "1" and attempt in fails:
    raise SystemExit(3)
if rank == "0":
    time.sleep(0.5)  # still running when rank 1 fails: it is stopped
"""


@pytest.fixture
def flaky(tmp_path):
    (tmp_path / "flaky.py").write_text(FLAKY)
    return tmp_path


def starts(folder):
    return sorted(os.path.basename(p) for p in glob.glob(str(folder / "started-*")))


def test_a_failed_process_is_restarted_with_the_others_and_the_run_succeeds(flaky):
    code, out, err = launch(flaky, "--nproc-per-node", "2", "--max-restarts", "2",
                            "--log-dir", "logs", "flaky.py", flaky)
    assert code == 0, err
    assert starts(flaky) == ["started-0-0", "started-0-1", "started-1-0", "started-1-1"]
    failed = [line for line in err.splitlines() if "restarting" in line]
    assert len(failed) == 1 and failed[0].startswith("agnostic launch: worker process ")
    assert failed[0].endswith("(rank 1, node 0) exited with status 3; restarting every "
                              "process of this node: attempt 2 of 3 (--max-restarts 2).")
    assert out.splitlines() == ["rank 0 attempt 0 of 3", "rank 0 attempt 1 of 3"]
    # Each attempt's output in its own folder, as torchrun's attempt_<n>.
    [run] = glob.glob(str(flaky / "logs" / "none_*"))
    for attempt in (0, 1):
        said = read(os.path.join(run, f"attempt_{attempt}", "rank_1", "stdout.log"))
        assert said == f"rank 1 attempt {attempt} of 3\n"


def test_restarts_used_up_end_the_run_naming_the_attempts(flaky):
    (flaky / "fail").write_text("0 1 2")
    code, _, err = launch(flaky, "--nproc_per_node", "2", "--max_restarts", "2", "flaky.py",
                          flaky)
    assert code == 3, err
    assert starts(flaky) == [f"started-{rank}-{attempt}" for rank in (0, 1)
                             for attempt in (0, 1, 2)]
    assert "restarting every process of this node: attempt 2 of 3 (--max-restarts 2)." in err
    assert "restarting every process of this node: attempt 3 of 3 (--max-restarts 2)." in err
    assert ("(rank 1, node 0) exited with status 3 on attempt 3 of 3 (--max-restarts 2 used "
            "up); stopping every process.") in err


def test_without_max_restarts_a_failure_ends_the_run(flaky):
    code, _, err = launch(flaky, "--nproc-per-node", "2", "flaky.py", flaky)
    assert code == 3, err
    assert starts(flaky) == ["started-0-0", "started-1-0"]
    assert "restarting" not in err and "(rank 1, node 0) exited with status 3; stopping " \
        "every process." in err


WAITS = """import os, signal, sys, time
folder, rank = sys.argv[1], os.environ["RANK"]
def stop(signum, frame):
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(folder, f"ready-{rank}-{os.environ['TORCHELASTIC_RESTART_COUNT']}"), "w").close()
time.sleep(60)
"""


def test_a_preempted_run_is_not_restarted(tmp_path):
    (tmp_path / "waits.py").write_text(WAITS)
    process = start(tmp_path, "--nproc-per-node", "2", "--max-restarts", "2", "waits.py",
                    tmp_path)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{rank}-0").exists() for rank in (0, 1)):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "restarting" not in err.decode()
    assert sorted(p.name for p in tmp_path.glob("ready-*")) == ["ready-0-0", "ready-1-0"]
