"""Kubeflow's training operator on one machine: each process started with
exactly the variables the operator gives its pod (TFJob, PyTorchJob,
JAXJob), with 127.0.0.1 for the pods' service names, the one thing faked
here. Each engine's tox environment runs its own operator's job."""
import json
import os
import sys

import pytest

from tests import jobs
from tests.conftest import engine_or_skip

engine_or_skip()

from agnostic.launch.processes import free_port  # noqa: E402

ENGINE = os.environ.get("KERAS_BACKEND")


def tfjob(chief_port, worker_port):
    # A TFJob with one chief and one worker: the chief is worker 0 for agnostic.
    roles = {"chief": [f"127.0.0.1:{chief_port}"], "worker": [f"127.0.0.1:{worker_port}"]}
    return [{"TF_CONFIG": json.dumps({"cluster": roles, "task": {"type": kind, "index": 0}})}
            for kind in ("chief", "worker")]


def pytorchjob(port):
    # A PyTorchJob with a master and a worker pod, one process each.
    return [{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
             "RANK": str(rank), "PYTHONUNBUFFERED": "1"} for rank in (0, 1)]


def jaxjob(port):
    return [{"COORDINATOR_ADDRESS": "127.0.0.1", "COORDINATOR_PORT": str(port),
             "NUM_PROCESSES": "2", "PROCESS_ID": str(rank)} for rank in (0, 1)]


# The job of this engine's operator, its environment's name, and the devices
# of each pod (JAX splits each pod's CPU in two; the others use one).
JOBS = {
    "tensorflow": (lambda: tfjob(free_port(), free_port()), "tf-config", 1),
    "torch": (lambda: pytorchjob(free_port()), "rank-variables", 1),
    "jax": (lambda: jaxjob(free_port()), "kubeflow-jaxjob", 2),
}
if ENGINE not in JOBS:
    pytest.skip(f"Kubeflow has no operator for {ENGINE}", allow_module_level=True)
MAKE, ENVIRONMENT, DEVICES = JOBS[ENGINE]
REPLICAS = 2 * DEVICES


def run_pods(script, *arguments):
    pods = [jobs.start(jobs.python(script, *arguments), AGNOSTIC_CPU_DEVICES=str(DEVICES),
                       AGNOSTIC_TEST_REPLICAS=str(REPLICAS), **variables)
            for variables in MAKE()]
    codes, outputs, _ = jobs.finish(pods)
    jobs.succeeded(codes, outputs)
    return jobs.chief_result(outputs), outputs


def test_the_operators_job_trains_like_one_device(tmp_path):
    result, _ = run_pods(jobs.SCENARIO, "equivalence", REPLICAS, tmp_path)
    jobs.check_like_one_device(result, REPLICAS, ENVIRONMENT)


def test_only_the_chief_pod_writes_and_shows_progress(tmp_path):
    result, outputs = run_pods(jobs.PROCESSES, "files", tmp_path)
    jobs.check_only_the_chief_wrote(result, tmp_path)
    assert sum(out.count("Epoch 1/2") for out, _ in outputs) == 1


if ENGINE == "torch":  # torch's plan needs no peer: the others join theirs

    def test_agnostic_info_in_a_pod_names_the_operators_job():
        # One pod's process, as its operator starts it: info answers from
        # resolve() itself, as backend_agnostic_compile would decide.
        pod = jobs.start([sys.executable, "-m", "agnostic", "info"],
                         AGNOSTIC_CPU_DEVICES=None, **pytorchjob(free_port())[1])
        codes, outputs, _ = jobs.finish([pod], seconds=120)
        jobs.succeeded(codes, outputs)
        printed = outputs[0][0]
        assert "environment: rank-variables" in printed
        assert "strategy=torch-ddp replicas=2 processes=2 process_id=1" in printed
