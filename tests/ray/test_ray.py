"""Ray Train runs a Keras user's training function, unchanged, in 2 workers
of a local Ray cluster. Under TorchTrainer (KERAS_BACKEND=torch) Ray has made
the torch process group before the function runs; under TensorflowTrainer
(KERAS_BACKEND=tensorflow) Ray sets TF_CONFIG after the worker has started
and imported TensorFlow. agnostic joins what Ray made, makes nothing of its
own beside it, and the workers end with the weights that the same function
compiled plainly gives on one device.

Each run is its own processes (Keras fixes its engine at import):
tests/ray/train_job.py is the Ray driver, or the one-device reference. This
process imports neither Keras nor Ray. Runs in the tox environment `ray`.
"""
import collections
import concurrent.futures
import glob
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests import models
from tests.conftest import ROOT, with_scikit_learn

JOB = os.path.join("tests", "ray", "train_job.py")
WORKERS = 2
ENGINES = ("torch", "tensorflow")
STRATEGY = {"torch": "torch-ddp", "tensorflow": "tf-multi-worker"}
SECONDS = 300  # a run takes under a minute on 2 cores
# Variables of the outer environment that would reach the local cluster's
# workers (they inherit the driver's environment) and change what they join.
CLEARED = ("KERAS_BACKEND", "AGNOSTIC_CPU_DEVICES", "TF_CONFIG", "RANK", "WORLD_SIZE",
           "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
           "KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
           "KERAS_DISTRIBUTION_PROCESS_ID", "RAY_ADDRESS")

# The runs that ask for CPU devices in the driver's environment: on
# TensorFlow, the one whose function makes its own strategy; on torch, the
# one every torch test reads (each run starts a Ray cluster, about 30 s on 2
# cores). A driver's environment without them: TensorFlow's plain run.
CPU_DEVICES = {"AGNOSTIC_CPU_DEVICES": "2"}
CPU_DEVICES_WAY = {"torch": "ray", "tensorflow": "ray-own-strategy"}
RAY_VARIABLES = {"torch": CPU_DEVICES, "tensorflow": {}}

# Every run the tests below ask for, the longest first.
RUNS = [("ray", "torch", tuple(CPU_DEVICES.items())), ("ray", "tensorflow", ()),
        ("ray-own-strategy", "tensorflow", tuple(CPU_DEVICES.items())),
        ("one-device", "torch", ()), ("one-device", "tensorflow", ())]

Job = collections.namedtuple("Job", "returncode stdout stderr folder")


def run_job(way, engine, folder, **variables):
    """Runs train_job.py WAY ENGINE FOLDER in fresh processes. Under Ray the
    workers get KERAS_BACKEND from the job's runtime_env alone."""
    environ = {key: value for key, value in os.environ.items() if key not in CLEARED}
    if way == "one-device":
        environ["KERAS_BACKEND"] = engine
    # The working tree's agnostic in every process, also where agnostic's
    # start-up hook imports it as a worker starts, before Ray puts the
    # driver's folders on the worker's path.
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, environ.get("PYTHONPATH")]))
    environ = with_scikit_learn(environ)  # the job reads scikit-learn's digits
    environ["RAY_USAGE_STATS_ENABLED"] = "0"
    environ.update(variables)
    process = subprocess.Popen(
        [sys.executable, JOB, way, engine, str(folder)], cwd=ROOT, env=environ,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    late = ""
    try:
        stdout, stderr = process.communicate(timeout=SECONDS)
    except subprocess.TimeoutExpired:
        late = f"\n(killed: not finished within {SECONDS} s)"
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
    finally:
        try:  # whatever the driver started and left behind
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return Job(process.returncode, stdout, stderr + late, str(folder))


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """job(way, engine, **variables): each run once for the whole module. The
    module's runs (RUNS) are made as the first is asked for, two at a time:
    a Ray job leaves about a third of 2 cores idle, and two local clusters
    side by side each take ports of their own."""
    done = {}

    def make(way, engine, variables):
        folder = tmp_path_factory.mktemp(f"{way}-{engine}")
        return run_job(way, engine, folder, **dict(variables))

    def job(way, engine, **variables):
        key = (way, engine, tuple(sorted(variables.items())))
        if not done:
            with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
                runs = {run: pool.submit(make, *run) for run in RUNS}
            done.update((run, future.result()) for run, future in runs.items())
        if key not in done:
            done[key] = make(*key)
        return done[key]

    return job


def finished(job):
    """The job's probes by rank, once it has ended well."""
    assert job.returncode == 0, (
        f"train_job.py failed ({job.returncode}):\n{job.stdout[-4000:]}\n{job.stderr[-8000:]}")
    probes = {}
    for path in glob.glob(os.path.join(job.folder, "probe_*.json")):
        with open(path) as handle:
            probe = json.load(handle)
        probes[probe.get("ray", {}).get("rank", 0)] = probe
    return probes


def weights(job, rank):
    return models.saved_weights(os.path.join(job.folder, f"weights_{rank}.npz"))


def check_like_one_device(job, reference):
    probes, expected = finished(job), finished(reference)[0]
    assert sorted(probes) == list(range(WORKERS))
    assert {probe["backend"] for probe in probes.values()} == {expected["backend"]}
    for rank, probe in probes.items():
        difference = models.relative_difference(weights(reference, 0), weights(job, rank))
        assert difference < 1e-5, f"rank {rank}: {difference}"
        np.testing.assert_allclose(probe["history"]["loss"], expected["history"]["loss"],
                                   atol=1e-3)
    return probes


def check_joined(probes, engine):
    """agnostic's plan in every worker is Ray's job: its size, the worker's rank."""
    for rank, probe in probes.items():
        assert probe["ray"] == {"rank": rank, "world_size": WORKERS, "local_rank": rank}
        plan = probe["plan"]
        assert plan["strategy"] == STRATEGY[engine], plan
        assert (plan["num_processes"], plan["process_id"]) == (WORKERS, rank), plan
        assert plan["num_replicas"] == WORKERS, plan
        assert probe["warnings"] == []  # no SingleDeviceWarning, nothing else
    assert any(line.startswith("plan:") and f"processes={WORKERS} environment=" in line
               for line in probes[0]["logs"]), probes[0]["logs"]
    assert probes[1]["logs"] == []  # the chief alone logs the plan


@pytest.mark.parametrize("engine", ENGINES)
def test_ray_workers_train_like_one_device(jobs, engine):
    check_like_one_device(jobs("ray", engine, **RAY_VARIABLES[engine]),
                          jobs("one-device", engine))


@pytest.mark.parametrize("engine", ENGINES)
def test_agnostic_joins_the_job_ray_made(jobs, engine):
    probes = finished(jobs("ray", engine, **RAY_VARIABLES[engine]))
    check_joined(probes, engine)
    for rank, probe in probes.items():
        assert probe["backend"] == engine  # from the job's runtime_env
        if engine == "torch":
            # Ray made the group before the function ran; agnostic trained in
            # that very group and made no second one.
            group = {"initialized": True, "rank": rank, "world_size": WORKERS,
                     "backend": "gloo"}
            assert probe["torch_group_before"] == group
            assert probe["torch_group_after"] == group
            assert probe["same_torch_group"]
        else:
            # One MultiWorkerMirroredStrategy over Ray's TF_CONFIG workers.
            strategy = probe["tf_strategy"]
            assert strategy["class"] in ("MultiWorkerMirroredStrategy",
                                         "CollectiveAllReduceStrategy"), strategy
            assert strategy["num_replicas_in_sync"] == WORKERS
            assert strategy["task_id"] == rank
            assert json.loads(probe["variables"]["TF_CONFIG"])["task"]["index"] == rank


@pytest.mark.parametrize("engine", ENGINES)
def test_only_the_chief_writes_files(jobs, engine):
    job = jobs("ray", engine, **RAY_VARIABLES[engine])
    assert sorted(finished(job)) == list(range(WORKERS))  # every worker got to the end
    saved = sorted(name for name in os.listdir(job.folder) if name.startswith("saved_by"))
    assert saved == ["saved_by_rank_0.keras"]


def test_a_function_with_its_own_multi_worker_strategy_trains_in_it(jobs):
    # Written as Ray's TensorFlow guide writes it: the function makes a
    # MultiWorkerMirroredStrategy from Ray's TF_CONFIG and builds and compiles
    # the model in its scope. agnostic trains under that strategy, not a
    # second one of its own. (This run also asks for CPU devices: below.)
    probes = check_like_one_device(jobs("ray-own-strategy", "tensorflow", **CPU_DEVICES),
                                   jobs("one-device", "tensorflow"))
    check_joined(probes, "tensorflow")
    for probe in probes.values():
        assert probe["tf_strategy"]["is_users"], probe["tf_strategy"]


@pytest.mark.parametrize("engine", ENGINES)
def test_cpu_devices_asked_in_the_drivers_environment(jobs, engine):
    # AGNOSTIC_CPU_DEVICES (set in the other engines' tox environments, and
    # in a shell that ran them) reaches the workers of a local cluster, so
    # agnostic starts in them before Ray has set TF_CONFIG or the rank
    # variables. They must still join Ray's job.
    job = jobs(CPU_DEVICES_WAY[engine], engine, **CPU_DEVICES)
    probes = check_like_one_device(job, jobs("one-device", engine))
    check_joined(probes, engine)
    assert {probe["variables"]["AGNOSTIC_CPU_DEVICES"] for probe in probes.values()} == {"2"}
