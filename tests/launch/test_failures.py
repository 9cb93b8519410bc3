"""Which failure of a group is named: no engine needed."""
import sys

from agnostic.launch import failures


def failure_of(error, rank=0):
    try:
        raise error
    except Exception:
        return failures.from_exception(rank, *sys.exc_info())


def test_a_collective_error_from_a_dead_peer_is_not_a_cause():
    gloo = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:40613. This "
                        "is typically caused by a remote worker crashing.")
    assert failures.caused_by_a_peer(gloo)
    assert not failures.caused_by_a_peer(RuntimeError("worker failure in rank 1"))
    wrapped = ValueError("step failed")
    wrapped.__cause__ = gloo
    assert failures.caused_by_a_peer(wrapped)


def test_the_earliest_own_failure_is_named_before_earlier_consequences():
    consequence = failures.Failure(0, own=False, summary="RuntimeError: closed", time=1.0)
    cause = failures.Failure(1, own=True, summary="RuntimeError: bug", time=2.0)
    later = failures.Failure(2, own=True, summary="RuntimeError: bug", time=3.0)
    assert failures.first_in_cause([consequence, later, cause]) is cause
    # Only consequences (every process saw a peer go): the earliest.
    other = failures.Failure(1, own=False, summary="RuntimeError: reset", time=0.5)
    assert failures.first_in_cause([consequence, other]) is other


def test_reports_round_trip_with_the_traceback(tmp_path):
    failure = failure_of(RuntimeError("worker failure in rank 1"), rank=1)
    assert failure.own and failure.summary == "RuntimeError: worker failure in rank 1"
    assert "Traceback (most recent call last)" in failure.details
    failures.write(str(tmp_path), failure)
    assert failures.read(str(tmp_path)) == {1: failure}


def test_a_signal_death_is_a_cause_named_by_its_signal():
    killed = failures.from_status(1, -9)
    assert killed.own and killed.summary == "killed by signal SIGKILL"
    assert failures.from_status(1, 3).summary == "exited with status 3"


# Each process aborts (SIGABRT) as it ends, as torch's gloo threads can in
# the interpreter's teardown; those that first said their work was done
# (torch-ddp says so once it has left its process group) ended well.
ABORTS = """import os, sys
from agnostic.launch import processes
rank = int(os.environ["RANK"])
if sys.argv[1] == "every" or rank == 0:
    processes.mark_finished(rank)
os.abort()
"""


def test_a_process_aborted_after_it_finished_its_work_ended_well(tmp_path):
    from tests.launch.launching import launch

    (tmp_path / "aborts.py").write_text(ABORTS)
    code, _, err = launch(tmp_path, "--nproc-per-node", "2", "aborts.py", "every")
    assert code == 0, err
    code, _, err = launch(tmp_path, "--nproc-per-node", "2", "aborts.py", "rank 0")
    assert code != 0 and "(rank 1, node 0) exited with status -6" in err, err
    assert "(rank 0, node 0)" not in err
