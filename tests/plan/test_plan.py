"""The decision, without any engine: device counts are faked here (mocked),
since a machine with GPUs cannot exist in this test environment."""
import dataclasses
import os
import subprocess
import sys

import pytest

import agnostic
from agnostic import cluster, devices, plan
from agnostic.plan import log, per_process, shards
from agnostic.devices import DeviceListing
from tests.conftest import ROOT

GPUS_4 = DeviceListing(
    tuple(f"/device:GPU:{i}" for i in range(4)), "/device:CPU:0", accelerators=True
)
ONE_CPU = DeviceListing(("/device:CPU:0",), "/device:CPU:0", accelerators=False)
CPUS_2 = DeviceListing(
    ("/device:CPU:0", "/device:CPU:1"), "/device:CPU:0", accelerators=False,
    simulated=True,
)


def test_every_gpu_by_default():
    chosen = plan.decide("tensorflow", GPUS_4)
    assert chosen.strategy == "tf-mirrored"
    assert chosen.devices == GPUS_4.devices
    assert chosen.num_replicas == 4
    assert (chosen.num_processes, chosen.process_id) == (1, 0)
    assert "4 devices of 4" in chosen.reason


def test_count_takes_the_first_devices():
    chosen = plan.decide("jax", GPUS_4, gpus=2)
    assert chosen.strategy == "jax-data-parallel"
    assert chosen.devices == GPUS_4.devices[:2]


def test_list_takes_those_ids_in_order():
    chosen = plan.decide("tensorflow", GPUS_4, gpus=[3, 1])
    assert chosen.devices == ("/device:GPU:3", "/device:GPU:1")
    assert chosen.num_replicas == 2


def test_one_requested_device_is_single_device_without_warning():
    chosen = plan.decide("tensorflow", GPUS_4, gpus=[0])
    assert chosen.strategy == "single-device"
    assert chosen.devices == ("/device:GPU:0",)
    assert chosen.fallback_warning is None
    assert not chosen.device_scope


@pytest.mark.parametrize("backend, strategy, scope", [
    ("tensorflow", "tf-mirrored", False), ("jax", "jax-data-parallel", False),
    ("mxnet", "mxnet-context", False), ("torch", "single-device", True)])
def test_one_device_that_is_not_the_default_is_placed_by_the_engine(backend, strategy, scope):
    # Only TensorFlow's, JAX's and MXNet's own strategies over the one device,
    # or torch's device scope, put the model on GPU 2: the plan says which.
    chosen = plan.decide(backend, GPUS_4, gpus=[2])
    assert (chosen.strategy, chosen.num_replicas, chosen.device_scope) == (strategy, 1, scope)
    assert chosen.devices[0].endswith("2")
    assert chosen.fallback_warning is None


@pytest.mark.parametrize("listing, relocation, strategy", [
    (GPUS_4, False, "tf-mirrored"), (GPUS_4, True, "tf-central-storage")])
def test_the_plan_names_tensorflows_runtime(listing, relocation, strategy):
    chosen = plan.decide("tensorflow", listing, cpu_relocation=relocation)
    assert chosen.strategy == strategy
    assert chosen.relocation_unused is None


@pytest.mark.parametrize("backend, listing, gpus", [
    ("tensorflow", ONE_CPU, None), ("tensorflow", GPUS_4, [2]), ("jax", GPUS_4, None),
    ("torch", GPUS_4, None), ("mxnet", GPUS_4, None)])
def test_the_plan_says_why_cpu_relocation_changes_nothing(backend, listing, gpus):
    chosen = plan.decide(backend, listing, gpus=gpus, cpu_relocation=True)
    assert chosen.strategy != "tf-central-storage"
    assert any(word in chosen.relocation_unused for word in ("variables", "parameters"))


def test_simulated_cpus_count_as_devices():
    chosen = plan.decide("jax", CPUS_2)
    assert chosen.strategy == "jax-data-parallel"
    assert "simulated CPU devices" in chosen.reason


def test_one_cpu_falls_back_with_a_warning_that_says_how_to_get_more():
    chosen = plan.decide("tensorflow", ONE_CPU)
    assert chosen.strategy == "single-device"
    assert chosen.devices == ("/device:CPU:0",)
    assert "no accelerator" in chosen.fallback_warning
    assert "AGNOSTIC_CPU_DEVICES=N" in chosen.fallback_warning


@pytest.mark.parametrize("backend", ["numpy", "openvino"])
def test_engine_without_multi_device_path_warns(backend):
    chosen = plan.decide(backend, GPUS_4, gpus=2)
    assert chosen.strategy == "single-device"
    assert f"'{backend}' has no multi-device path" in chosen.fallback_warning
    assert "KERAS_BACKEND" in chosen.fallback_warning


def test_plan_is_frozen():
    chosen = plan.decide("tensorflow", GPUS_4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        chosen.strategy = "other"
    assert chosen.strategy == "tf-mirrored"


@pytest.mark.parametrize(
    "gpus, message",
    [
        (5, r"gpus=5 asks for 5 devices, but only 4 exist: 0: /device:GPU:0, "
            r"1: /device:GPU:1, 2: /device:GPU:2, 3: /device:GPU:3\. Pass "
            r"gpus=None to use all of them, or a number up to 4\."),
        ([0, 7], r"gpus=\[0, 7\] names device id 7, which does not exist\. "
                 r"The devices are 0: /device:GPU:0, .* \(ids 0 to 3\)\."),
        ([1, 1], r"`gpus` names device 1 more than once"),
        (0, r"`gpus` must be at least 1; .* Received: gpus=0"),
        (-2, r"`gpus` must be at least 1; .* Received: gpus=-2"),
        ([], r"`gpus` is an empty list"),
        ([-1], r"cannot be negative\. Received: gpus=\[-1\]"),
        ("2", r"`gpus` must be None .* Received: gpus='2' \(of type str\)"),
        (2.0, r"Received: gpus=2.0 \(of type float\)"),
        (True, r"Received: gpus=True \(of type bool\)"),
        ([0, "1"], r"Every device id in `gpus` must be an int"),
    ],
)
def test_bad_gpus_values_are_refused_with_the_devices_that_exist(gpus, message):
    with pytest.raises(agnostic.DeviceRequestError, match=message):
        plan.decide("tensorflow", GPUS_4, gpus=gpus)


def test_device_request_error_is_a_value_error():
    assert issubclass(agnostic.DeviceRequestError, ValueError)
    assert issubclass(agnostic.SingleDeviceWarning, UserWarning)


def test_without_accelerators_the_error_says_how_to_split_the_cpu():
    with pytest.raises(agnostic.DeviceRequestError, match="AGNOSTIC_CPU_DEVICES=N"):
        plan.decide("jax", ONE_CPU, gpus=2)


@pytest.mark.parametrize("raw, expected", [("", 0), ("4", 4), (" 2 ", 2)])
def test_cpu_devices_variable(raw, expected):
    assert devices.requested_cpu_devices({"AGNOSTIC_CPU_DEVICES": raw}) == expected


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5"])
def test_bad_cpu_devices_variable(raw):
    with pytest.raises(agnostic.DeviceRequestError, match="AGNOSTIC_CPU_DEVICES must be"):
        devices.requested_cpu_devices({"AGNOSTIC_CPU_DEVICES": raw})


def test_simulated_devices_past_a_sane_number_per_core_are_refused():
    # Before: 100000 planned as many torch processes with a warning, and
    # JAX's resolve() had not returned after 120 s.
    limit = devices.cpu_devices_limit()
    assert limit >= devices.LIMIT_FLOOR
    assert devices.requested_cpu_devices({"AGNOSTIC_CPU_DEVICES": str(limit)}) == limit
    with pytest.raises(agnostic.DeviceRequestError,
                       match=rf"AGNOSTIC_CPU_DEVICES=100000 asks for more .* at most {limit} "):
        devices.requested_cpu_devices({"AGNOSTIC_CPU_DEVICES": "100000"})


class Index:
    """A whole number of another library, as NumPy's int64 is: it has
    __index__ and is no int."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


def test_whole_numbers_of_other_libraries_mean_what_ints_mean():
    assert plan.whole_numbers(Index(2)) == 2 and type(plan.whole_numbers(Index(2))) is int
    assert plan.whole_numbers([Index(3), 1]) == [3, 1]
    assert plan.whole_numbers(None) is None and plan.whole_numbers(True) is True
    chosen = plan.decide("tensorflow", GPUS_4, gpus=plan.whole_numbers(Index(2)))
    assert chosen.num_replicas == 2
    numpy = pytest.importorskip("numpy")  # the case users meet: gpus=np.int64(2)
    assert plan.whole_numbers(numpy.int64(2)) == 2
    assert plan.whole_numbers(list(numpy.arange(2))) == [0, 1]
    with pytest.raises(agnostic.DeviceRequestError, match="must be None"):
        plan.check_gpus_type(plan.whole_numbers(numpy.bool_(True)))


@pytest.mark.parametrize("name, value, message", [
    ("AGNOSTIC_CPU_DEVICES", "abc", "AGNOSTIC_CPU_DEVICES must be a whole number"),
    ("AGNOSTIC_JOIN", "yes", "AGNOSTIC_JOIN must be 1 (join"),
    ("AGNOSTIC_JOIN_SECONDS", "0", "AGNOSTIC_JOIN_SECONDS must be a whole number of seconds"),
    ("AGNOSTIC_JOIN_SECONDS", "1m", "Received: AGNOSTIC_JOIN_SECONDS='1m'"),
    ("AGNOSTIC_START_EARLY", "yes", "AGNOSTIC_START_EARLY must be 1 (start the other"),
])
def test_resolve_names_a_bad_variable_before_anything(monkeypatch, name, value, message):
    # Read at start-up, where nothing can be raised, they fall back to their
    # defaults there; the plan refuses them with their value and the fix.
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(devices, "current_backend", lambda: pytest.fail("looked further"))
    with pytest.raises(agnostic.AgnosticError, match=message.replace("(", r"\(")):
        agnostic.resolve()


def test_configured_backend_reads_the_variable_then_keras_json(tmp_path):
    assert devices.configured_backend({"KERAS_BACKEND": "jax"}) == "jax"
    (tmp_path / "keras.json").write_text('{"backend": "torch"}')
    assert devices.configured_backend({"KERAS_HOME": str(tmp_path)}) == "torch"
    assert devices.configured_backend({"KERAS_HOME": str(tmp_path / "none")}) == "tensorflow"


def test_tensorflow_workers_span_processes():
    names = ("/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0")
    listing = DeviceListing(names, names[0], accelerators=False, num_processes=2,
                            process_id=1)
    chosen = plan.decide("tensorflow", listing)
    assert (chosen.strategy, chosen.num_replicas, chosen.num_processes,
            chosen.process_id) == ("tf-multi-worker", 2, 2, 1)
    # cpu_relocation: each worker keeps its own copy; the plan says so.
    relocated = plan.decide("tensorflow", listing, cpu_relocation=True)
    assert relocated.strategy == "tf-multi-worker"
    assert "each TensorFlow worker" in relocated.relocation_unused
    with pytest.raises(agnostic.DeviceRequestError, match="2 processes"):
        plan.decide("tensorflow", listing, gpus=4)


def test_tensorflow_workers_run_one_step_per_execution_as_the_plan_says():
    names = ("/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0")
    workers = DeviceListing(names, names[0], accelerators=False, num_processes=2)
    assert plan.decide("tensorflow", workers).steps_per_execution == 1
    # Every other plan runs the program's own steps_per_execution.
    assert plan.decide("tensorflow", CPUS_2).steps_per_execution is None
    assert plan.decide("jax", CPUS_2).steps_per_execution is None


SLURM_RANK_1 = cluster.Environment("slurm", 4, 1, local_rank=1, local_world_size=2,
                                   coordinator="n1", port=15000)
SLURM_HOSTS = dataclasses.replace(SLURM_RANK_1, hosts=("n1", "n1", "n2", "n2"))


def test_a_jobs_process_joins_its_engine_as_the_plan_says():
    # JAX: the coordinator on the first node; each of a node's 2 processes
    # drives its own device, one process per node all of them.
    jax = plan.decide("jax", CPUS_2, None, SLURM_HOSTS).joining
    assert (jax.coordinator, jax.local_device_ids) == ("n1:15000", (1,))
    alone_on_its_node = dataclasses.replace(SLURM_HOSTS, local_rank=0, local_world_size=1)
    assert per_process.joining("jax", alone_on_its_node).local_device_ids is None
    # torchrun's agent holds the port: the engines take the next ones.
    taken = dataclasses.replace(SLURM_HOSTS, name="torchrun", port_taken=True)
    assert per_process.joining("jax", taken).coordinator == "n1:15001"
    # TensorFlow: one worker per process, each with its own port, in rank
    # order; TF_CONFIG's list where it is set; torchrun's hosts are shared
    # at the join.
    assert per_process.joining("tensorflow", SLURM_HOSTS, environ={}).workers == (
        "n1:15000", "n1:15001", "n2:15002", "n2:15003")
    config = '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}'
    assert per_process.joining("tensorflow", SLURM_HOSTS,
                               environ={"TF_CONFIG": config}).workers == ("a:1", "b:2")
    unnamed = dataclasses.replace(taken, hosts=None)
    assert per_process.joining("tensorflow", unnamed, environ={}).workers is None
    with pytest.raises(agnostic.LaunchError, match="does not say where each process runs"):
        per_process.joining("tensorflow", SLURM_RANK_1, environ={})
    high = dataclasses.replace(SLURM_HOSTS, port=cluster.HIGHEST_PORT - 1)
    with pytest.raises(agnostic.LaunchError, match="Choose a lower MASTER_PORT"):
        per_process.joining("tensorflow", high, environ={})
    assert plan.decide("torch", TWO_GPUS).joining is None  # no job: nothing to join
# Made-up GPUs (mocked): a machine with GPUs cannot exist in this test environment.
TWO_GPUS = DeviceListing(("cuda:0", "cuda:1"), "cpu", accelerators=True)
ONE_GPU = DeviceListing(("cuda:0",), "cpu", accelerators=True)


def test_the_plan_names_the_environment():
    chosen = plan.decide("torch", TWO_GPUS, None, SLURM_RANK_1)
    assert (chosen.environment, chosen.process_id, chosen.num_processes) == ("slurm", 1, 4)
    assert "environment=slurm" in chosen.describe()
    assert plan.decide("torch", TWO_GPUS).environment == "none"
    # The job itself travels with the plan: the strategy does not look again.
    assert chosen.job is SLURM_RANK_1 and plan.decide("torch", TWO_GPUS).job is None


def test_the_plan_says_who_starts_torchs_processes_and_how_they_talk():
    # Mocked: GPU listings (no GPU here). agnostic starts the processes only
    # where no job did; NCCL across GPUs, gloo on the CPU.
    alone = plan.decide("torch", TWO_GPUS)
    assert (alone.starts_processes, alone.process_group) == (True, "nccl")
    in_a_job = plan.decide("torch", TWO_GPUS, None, SLURM_RANK_1)
    assert (in_a_job.starts_processes, in_a_job.process_group) == (False, "nccl")
    cpus = DeviceListing(("cpu:0", "cpu:1"), "cpu:0", accelerators=False, simulated=True)
    assert plan.decide("torch", cpus).process_group == "gloo"
    one = plan.decide("torch", ONE_GPU)
    assert (one.starts_processes, one.process_group) == (False, None)
    assert plan.decide("jax", CPUS_2).process_group is None


def test_tasks_per_node_must_match_the_accelerators():
    # Two tasks, each seeing its own GPU (--gpus-per-task=1), or both GPUs: fine.
    assert plan.decide("torch", ONE_GPU, None, SLURM_RANK_1).num_replicas == 4
    four_gpus = DeviceListing(tuple(f"cuda:{i}" for i in range(4)), "cpu", accelerators=True)
    with pytest.raises(agnostic.DeviceRequestError) as raised:
        plan.decide("torch", four_gpus, None, SLURM_RANK_1)
    assert ("slurm started 2 processes on this node, which has 4 accelerators visible "
            "to each of them; torch trains with one process per accelerator. Start 4 "
            "process(es) per node") in str(raised.value)
    workers = DeviceListing(tuple(f"/job:worker/task:{t}/device:GPU:{g}" for t in range(4)
                                  for g in range(2)), "cpu", accelerators=True,
                            num_processes=4, process_id=1)
    with pytest.raises(agnostic.DeviceRequestError, match="one process per node"):
        plan.decide("tensorflow", workers, None, SLURM_RANK_1)


# The thread count each process gets, and the plan line that says it.
def test_torch_processes_share_the_cores(monkeypatch):
    for name in devices.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(devices, "cores", lambda: 8)  # mocked: a machine's core count
    chosen = plan.decide("torch", TWO_GPUS)
    assert (chosen.num_processes, chosen.threads) == (2, 4)
    assert ("processes=2 threads=4 per process (8 core(s) shared by 2 processes on this "
            "machine; set OMP_NUM_THREADS to choose)") in chosen.describe()
    # A scheduler's job: the processes of this node share it, not the whole job's.
    assert plan.decide("torch", ONE_GPU, None, SLURM_RANK_1).threads == 4
    # One process keeps the engine's default; so do JAX and TensorFlow.
    assert plan.decide("torch", ONE_GPU).threads is None
    assert plan.decide("jax", CPUS_2).threads is None
    assert "threads=engine default" in plan.decide("tensorflow", GPUS_4).describe()


def test_the_users_thread_count_is_kept_and_said(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    chosen = plan.decide("torch", TWO_GPUS)
    assert chosen.threads is None
    assert "threads=OMP_NUM_THREADS=3 (set before start)" in chosen.describe()


def test_more_simulated_devices_than_cores_are_said(monkeypatch):
    for name in devices.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(devices, "cores", lambda: 2)
    four = DeviceListing(tuple(f"cpu:{i}" for i in range(4)), "cpu:0", accelerators=False,
                         simulated=True)
    assert ("4 simulated CPU devices on 2 core(s) take turns, so they test a many-device "
            "program but train no faster") in plan.decide("jax", four).describe()
    assert "take turns" not in plan.decide("jax", CPUS_2).describe()


def test_a_single_device_plan_says_why_once(caplog):
    """The plan line leaves the reason to the SingleDeviceWarning, which
    gives it with the advice (not the same sentence twice)."""
    import logging

    single = plan.decide("jax", ONE_CPU)
    assert single.fallback_warning.startswith(single.reason.rstrip("."))
    with caplog.at_level(logging.INFO, logger="agnostic"), \
            pytest.warns(agnostic.SingleDeviceWarning) as warned:
        log.announce(single)
    (line,) = [r.getMessage() for r in caplog.records if "plan:" in r.getMessage()]
    assert line.endswith("devices=[/device:CPU:0] (why: the SingleDeviceWarning below)")
    assert single.reason not in line
    assert str(warned[0].message) == single.fallback_warning


ANNOUNCE = (
    "import logging\n{setup}\n"
    "from agnostic import plan\n"
    "from agnostic.plan import log\n"
    "log.announce(plan.Plan('jax', 'jax-data-parallel', ('cpu:0', 'cpu:1'), 2, "
    "reason='2 simulated CPU devices.'))\n"
    "log.announce(plan.Plan('jax', 'jax-data-parallel', ('cpu:0',), 1, process_id=1))\n"
    "print('{{}}')")


@pytest.mark.parametrize("setup, variables, shown", [
    ("", {}, True),  # nothing configured: on stderr, once, from the chief only
    ("logging.basicConfig()", {}, True),  # the root's handler shows it
    ("", {"AGNOSTIC_QUIET": "1"}, False),
    ("logging.getLogger('agnostic').setLevel(logging.WARNING)", {}, False),
])
def test_the_plan_line_is_visible_by_default(setup, variables, shown):
    result = subprocess.run([sys.executable, "-c", ANNOUNCE.format(setup=setup)],
                            capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env=dict(os.environ, **variables))
    assert result.returncode == 0, result.stderr
    # Short: the engine, the strategy, the devices; the reason is at DEBUG.
    line = "plan: backend=jax strategy=jax-data-parallel replicas=2 processes=1 " \
        "devices=[cpu:0, cpu:1]\n"
    assert result.stderr.count(line) == (1 if shown else 0), result.stderr
    assert "2 simulated CPU devices." not in result.stderr
    assert "devices=[cpu:0]:" not in result.stderr  # process 1 says nothing
    if shown and not setup:
        assert result.stderr.startswith("agnostic: plan: backend=jax"), result.stderr


def test_a_process_pinned_to_its_own_cores_uses_them_all(monkeypatch):
    # A scheduler's share (srun --cpus-per-task with binding): already this
    # process's own, so not divided again. Mocked: 4 of the machine's 16 cores.
    for name in devices.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(devices, "cores", lambda: 4)
    monkeypatch.setattr(devices.os, "cpu_count", lambda: 16)
    chosen = plan.decide("torch", ONE_GPU, None, SLURM_RANK_1)
    assert chosen.threads == 4
    assert "threads=4 per process (the 4 core(s) this process is pinned to;" in \
        chosen.describe()
    # The processes agnostic starts inherit the cores of the one that starts them.
    assert plan.decide("torch", TWO_GPUS).threads == 2


def test_shard_splits_jax_and_torch_and_is_refused_elsewhere():
    chosen = shards.sharded(plan.decide("jax", GPUS_4))
    assert chosen.strategy == "jax-sharded" and chosen.num_replicas == 4
    assert chosen.reason.endswith("shard=True: each large weight and its optimizer state "
                                  "split over the 4 devices.")
    one = plan.decide("jax", GPUS_4, gpus=1)
    assert shards.sharded(one) == one  # one device holds everything either way
    split = shards.sharded(plan.decide("torch", GPUS_4))
    assert (split.strategy, split.num_processes) == ("torch-sharded", 4)
    assert split.reason.endswith("shard=True: each process holds 1/4 of each large weight "
                                 "and its optimizer state between steps, gathered per layer "
                                 "(ZeRO stage 3); gradients are averaged whole.")
    with pytest.raises(agnostic.NotSupportedError,
                       match="where tensorflow does not shard yet.*Received: shard=True"):
        shards.sharded(plan.decide("tensorflow", GPUS_4))
    several = dataclasses.replace(plan.decide("jax", GPUS_4), num_processes=2)
    assert shards.sharded(several).strategy == "jax-sharded"  # over every process's devices
    placed = dataclasses.replace(plan.decide("jax", GPUS_4),
                                 placements=(("dense", "/device:GPU:1"),))
    with pytest.raises(agnostic.NotSupportedError, match="placed with agnostic.device()"):
        shards.sharded(placed)
