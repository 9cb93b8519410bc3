"""The same unchanged scripts under real schedulers (a local SLURM cluster of
two "nodes", Open MPI's mpirun), on TensorFlow, JAX and torch: each trains
like one device, only the chief writes and shows progress, and a killed task
ends the whole job. Both "nodes" are this machine: the only thing faked."""
import os
import time

import pytest

from tests import jobs
from tests.conftest import ROOT

ENGINES = ("tensorflow", "jax", "torch")
# Devices per process: JAX splits each process's CPU in two.
DEVICES = {"tensorflow": 1, "jax": 2, "torch": 1}
KILL_BOUND_SECONDS = 60


def variables(engine, tasks=2):
    env = {"KERAS_BACKEND": engine, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1",
           "AGNOSTIC_TEST_REPLICAS": str(tasks * DEVICES[engine]),
           "AGNOSTIC_CPU_DEVICES": str(DEVICES[engine])}
    return env


def srun(engine):
    # torch and JAX: one task on each node; TensorFlow: two workers on one node,
    # so that each needs a port of its own.
    if engine == "tensorflow":
        return ["srun", "--kill-on-bad-exit=1", "-n2"]
    return ["srun", "--kill-on-bad-exit=1", "-N2", "-n2", "--ntasks-per-node=1"]


# Under SLURM every engine trains like one device; what SLURM and mpirun
# change is how a job's ranks are found (SLURM_* and OMPI_* variables:
# tests/cluster), not what an engine does with them, so the other tests (the
# chief alone writing, a killed task ending the job) run one engine under
# each scheduler, another under the other, and each engine meets mpirun once.
SLURM_ENGINES = {"test_the_job_trains_like_one_device": ENGINES,
                 "test_only_the_chief_writes_and_shows_progress": ("torch",),
                 "test_a_killed_task_ends_the_job": ("jax",)}
OPENMPI_ENGINE = {"test_the_job_trains_like_one_device": "torch",
                  "test_only_the_chief_writes_and_shows_progress": "jax",
                  "test_a_killed_task_ends_the_job": "tensorflow"}


def pytest_generate_tests(metafunc):
    if "scheduler" in metafunc.fixturenames and "engine" in metafunc.fixturenames:
        name = metafunc.function.__name__
        pairs = [("slurm", engine) for engine in SLURM_ENGINES[name]]
        pairs.append(("openmpi", OPENMPI_ENGINE[name]))
        metafunc.parametrize("scheduler, engine", pairs, indirect=["scheduler"],
                             ids=[f"{name}-{engine}" for name, engine in pairs])


@pytest.fixture
def scheduler(request):
    """Runs a command as the job's tasks: (exit code, stdout, stderr)."""
    if request.param == "slurm":
        cluster = request.getfixturevalue("slurm_cluster")

        def run(engine, command, timeout):
            result = cluster.run(srun(engine) + command, env=variables(engine),
                                 timeout=timeout, cwd=ROOT)
            if result.returncode not in (0, None) and "Killed" not in result.stderr:
                result.stderr += cluster.logs()
            return result
    else:
        openmpi = request.getfixturevalue("openmpi")

        def run(engine, command, timeout):
            return openmpi.mpirun(2, command, env=variables(engine), timeout=timeout,
                                  cwd=ROOT)
    run.name = request.param
    return run


def output_of(result):
    return [(result.stdout, result.stderr)]


def test_the_job_trains_like_one_device(scheduler, engine, tmp_path):
    replicas = 2 * DEVICES[engine]
    result = scheduler(engine, jobs.python(jobs.SCENARIO, "equivalence", replicas, tmp_path),
                       timeout=600)
    jobs.succeeded([result.returncode], output_of(result))
    jobs.check_like_one_device(jobs.chief_result(output_of(result)), replicas,
                               scheduler.name)


def test_only_the_chief_writes_and_shows_progress(scheduler, engine, tmp_path):
    result = scheduler(engine, jobs.python(jobs.PROCESSES, "files", tmp_path), timeout=600)
    jobs.succeeded([result.returncode], output_of(result))
    jobs.check_only_the_chief_wrote(jobs.chief_result(output_of(result)), tmp_path)
    assert result.stdout.count("Epoch 1/2") == 1


def test_a_killed_task_ends_the_job(scheduler, engine, tmp_path):
    # Task 1 kills itself (SIGKILL) in the middle of training.
    result = scheduler(engine, jobs.python(jobs.PROCESSES, "sigkill", tmp_path), timeout=300)
    ended = time.time()
    assert result.returncode != 0
    started = os.path.getmtime(tmp_path / "started")  # rank 0, a batch before the kill
    assert ended - started < KILL_BOUND_SECONDS
