"""Process groups without any engine: torchrun's variables, joining, and the
errors a launch can give. GPU names are made up here (mocked), since a
machine with GPUs cannot exist in this test environment."""
import sys

import pytest

import agnostic
from agnostic import errors, plan
from agnostic.devices import DeviceListing
from agnostic.launch import environment, local
from agnostic.strategies import torch_ddp

CPUS_4 = DeviceListing(tuple(f"cpu:{i}" for i in range(4)), "cpu:0",
                       accelerators=False, simulated=True)
TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}


def test_plain_process_has_no_group():
    assert environment.from_environment({}) is None


def test_torchrun_variables_make_a_group():
    group = environment.from_environment(TORCHRUN)
    assert (group.rank, group.world_size, group.local_rank) == (1, 2, 1)
    assert group.address == "tcp://127.0.0.1:29555"
    assert not group.is_chief


@pytest.mark.parametrize("changes, message", [
    ({"RANK": "one"}, "must be whole numbers"),
    ({"RANK": "2"}, r"RANK must be between 0 and WORLD_SIZE - 1\. Received: RANK=2"),
])
def test_bad_torchrun_variables(changes, message):
    with pytest.raises(agnostic.DeviceRequestError, match=message):
        environment.from_environment(dict(TORCHRUN, **changes))


def test_a_torchrun_process_joins_its_group():
    group = environment.from_environment(TORCHRUN)
    chosen = plan.decide("torch", CPUS_4, None, group)
    assert chosen.strategy == "torch-ddp"
    assert (chosen.num_processes, chosen.process_id, chosen.num_replicas) == (2, 1, 2)
    assert chosen.devices == ("cpu:0", "cpu:1")


def test_gpus_that_disagree_with_torchrun_are_refused():
    group = environment.from_environment(TORCHRUN)
    with pytest.raises(agnostic.DeviceRequestError,
                       match=r"one of WORLD_SIZE=2 processes .* gpus=4 asks for 4"):
        plan.decide("torch", CPUS_4, 4, group)


def test_a_plain_process_plans_one_process_per_device():
    chosen = plan.decide("torch", CPUS_4, 3)
    assert (chosen.strategy, chosen.num_processes, chosen.process_id) == ("torch-ddp", 3, 0)
    assert "this one and 2 started by agnostic" in chosen.reason


def test_relaunch_needs_a_script(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["-c"])  # as `python -c "..."` leaves it
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    with pytest.raises(errors.LaunchError, match=r"not started from a script file .*`torchrun --nproc-per-node N"):
        local.script_command()


def test_rank_zero_must_use_the_first_gpu():
    on_gpus = agnostic.Plan("torch", "torch-ddp", ("cuda:2", "cuda:3"), 2, num_processes=2)
    with pytest.raises(errors.LaunchError, match=r"Include device 0 first .* CUDA_VISIBLE_DEVICES"):
        torch_ddp._device_indexes(on_gpus)
    ordered = agnostic.Plan("torch", "torch-ddp", ("cuda:0", "cuda:3"), 2, num_processes=2)
    assert torch_ddp._device_indexes(ordered) == [0, 3]
