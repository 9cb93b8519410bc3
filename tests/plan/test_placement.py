"""Device parallelism decided without an engine: which devices run a
model's agnostic.device() placements, and what is refused before anything
starts."""
import pytest

import agnostic
from agnostic import cluster, errors
from agnostic import plan as plan_lib
from agnostic.devices import DeviceListing

GPUS = DeviceListing(("/device:GPU:0", "/device:GPU:1"), "/device:CPU:0", accelerators=True)
CPUS = DeviceListing(tuple(f"/device:CPU:{i}" for i in range(4)), "/device:CPU:0",
                     accelerators=False, simulated=True)
JAX_CPUS = DeviceListing(tuple(f"cpu:{i}" for i in range(4)), "cpu:0", accelerators=False,
                         simulated=True)
# The legacy example: a shared LSTM on devices 0 and 1, the merge on the CPU.
LEGACY = (("lstm:0", 0), ("lstm:1", 1), ("concatenate:0", "cpu"))


def test_the_plan_names_the_device_of_every_placed_call():
    plan = plan_lib.decide("tensorflow", GPUS, placements=LEGACY)
    assert plan.strategy == "tf-device-parallel"
    assert plan.num_replicas == 1
    assert plan.devices == ("/device:GPU:0", "/device:GPU:1", "/device:CPU:0")
    assert plan.placements == (("lstm:0", "/device:GPU:0"), ("lstm:1", "/device:GPU:1"),
                               ("concatenate:0", "/device:CPU:0"))
    assert "placements=[lstm:0 -> /device:GPU:0, lstm:1 -> /device:GPU:1, " in plan.describe()
    assert plan.placement_warning is None


def test_a_placement_on_a_device_that_does_not_exist_is_refused_as_gpus_is():
    with pytest.raises(errors.DeviceRequestError) as raised:
        plan_lib.decide("torch", GPUS, placements=(("dense:0", 0), ("dense_1:0", 2)))
    assert str(raised.value) == (
        "agnostic.device(2) places the call 'dense_1:0' on device id 2, which does not "
        "exist. The devices are 0: /device:GPU:0, 1: /device:GPU:1 (ids 0 to 1).")
    with pytest.raises(errors.DeviceRequestError, match="set AGNOSTIC_CPU_DEVICES=N"):
        plan_lib.decide("tensorflow", CPUS, placements=(("dense:0", 4),))


def test_gpus_must_keep_every_placed_device():
    with pytest.raises(errors.DeviceRequestError,
                       match=r"device id 1, which gpus=\[0\] leaves out"):
        plan_lib.decide("tensorflow", GPUS, gpus=[0], placements=LEGACY)


def test_tensorflow_says_which_devices_stay_idle_and_refuses_asking_for_replicas():
    plan = plan_lib.decide("tensorflow", CPUS, placements=LEGACY)
    assert plan.devices == ("/device:CPU:0", "/device:CPU:1")
    assert "/device:CPU:2, /device:CPU:3 stay idle" in plan.placement_warning
    with pytest.raises(errors.NotSupportedError,
                       match=r"not supported on tensorflow yet \(on JAX and torch it is\). "
                             r"Pass gpus=None or gpus=\[0, 1\]"):
        plan_lib.decide("tensorflow", CPUS, gpus=4, placements=LEGACY)


def test_torch_runs_a_process_per_replica_of_the_placed_devices():
    plan = plan_lib.decide("torch", CPUS, placements=LEGACY)
    assert plan.strategy == "torch-device-parallel"
    assert (plan.num_replicas, plan.num_processes, plan.process_id) == (2, 2, 0)
    assert plan.devices == tuple(f"/device:CPU:{i}" for i in range(4))
    assert plan.placement_warning is None
    # A process the launcher started: its rank, in a job of one process per replica.
    started = cluster.Environment("agnostic", 2, 1, started_by_scheduler=False)
    plan = plan_lib.decide("torch", CPUS, environment=started, placements=LEGACY)
    assert (plan.num_processes, plan.process_id, plan.environment) == (2, 1, "agnostic")
    with pytest.raises(errors.DeviceRequestError, match="do not split into replicas of the 2"):
        plan_lib.decide("torch", CPUS, gpus=3, placements=LEGACY)
    job = cluster.Environment("slurm", 4, 0)
    with pytest.raises(errors.DeviceRequestError,
                       match="8 devices are needed, and this process sees 4. Start 2"):
        plan_lib.decide("torch", CPUS, environment=job, placements=LEGACY)


def test_jax_runs_replicas_of_the_placed_devices_on_the_others():
    plan = plan_lib.decide("jax", JAX_CPUS, placements=(("a:0", 1), ("b:0", 3)))
    assert plan.strategy == "jax-model-parallel"
    assert plan.num_replicas == 2
    assert plan.devices == ("cpu:1", "cpu:3", "cpu:0", "cpu:2")  # (replicas, placed) mesh
    assert "cannot keep a layer on one device" in plan.placement_warning
    with pytest.raises(errors.DeviceRequestError, match="do not split into replicas of the 2"):
        plan_lib.decide("jax", JAX_CPUS, gpus=3, placements=(("a:0", 0), ("b:0", 1)))


def test_placements_in_one_of_several_processes_are_torch_only():
    several = DeviceListing(("cpu:0", "cpu:1"), "cpu:0", accelerators=False, num_processes=2)
    with pytest.raises(errors.NotSupportedError, match="one of 2 that train together. On jax"):
        plan_lib.decide("jax", several, placements=LEGACY)


def test_an_engine_without_placement_trains_as_before_and_says_so():
    host = DeviceListing(("cpu:0",), "cpu:0", accelerators=False)
    plan = plan_lib.decide("numpy", host, placements=LEGACY)
    assert plan.strategy == "single-device"
    assert "placements are ignored" in plan.placement_warning


def test_cpu_relocation_changes_nothing_with_placements():
    plan = plan_lib.decide("tensorflow", GPUS, cpu_relocation=True, placements=LEGACY)
    assert "first call" in plan.relocation_unused


@pytest.mark.parametrize("bad", [-1, "gpu", 1.5, True, None])
def test_device_takes_a_device_id_or_cpu(bad):
    with pytest.raises(errors.DeviceRequestError, match=r"Received: device_id="):
        with agnostic.device(bad):
            pass
