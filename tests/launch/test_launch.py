"""Process groups without any engine: torchrun's variables, joining, and the
errors a launch can give. GPU names are made up here (mocked), since a
machine with GPUs cannot exist in this test environment."""
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

import agnostic
from agnostic import errors, plan
from agnostic.devices import DeviceListing
from agnostic import cluster
from agnostic.launch import local, processes
from tests.conftest import ROOT

# Starts no engine in any process (tests/conftest.py: where it runs).
pytestmark = pytest.mark.engine_free

CPUS_4 = DeviceListing(tuple(f"cpu:{i}" for i in range(4)), "cpu:0",
                       accelerators=False, simulated=True)
TORCHRUN = {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}


def test_torchrun_variables_make_a_job():
    group = cluster.detect(TORCHRUN)
    assert (group.rank, group.world_size, group.local_rank) == (1, 2, 1)
    assert group.address == "tcp://127.0.0.1:29555"
    assert not group.is_chief


def test_a_torchrun_process_joins_its_group():
    group = cluster.detect(TORCHRUN)
    chosen = plan.decide("torch", CPUS_4, None, group)
    assert chosen.strategy == "torch-ddp"
    assert (chosen.num_processes, chosen.process_id, chosen.num_replicas) == (2, 1, 2)
    assert chosen.devices == ("cpu:0", "cpu:1")


def test_gpus_that_disagree_with_torchrun_are_refused():
    group = cluster.detect(TORCHRUN)
    with pytest.raises(agnostic.DeviceRequestError,
                       match=r"one of 2 processes started by torchrun, but gpus=4 asks for 4"):
        plan.decide("torch", CPUS_4, 4, group)


def test_a_plain_process_plans_one_process_per_device():
    chosen = plan.decide("torch", CPUS_4, 3)
    assert (chosen.strategy, chosen.num_processes, chosen.process_id) == ("torch-ddp", 3, 0)
    assert "this one and 2 started by agnostic" in chosen.reason


def test_relaunch_needs_a_script(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["-c"])  # as `python -c "..."` leaves it
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    with pytest.raises(errors.LaunchError, match=r"not started from a script file .*`torchrun --nproc-per-node N"):
        processes.script_command()


def test_rank_zero_must_use_the_first_gpu():
    # The GPUs are stand-ins (a listing): this machine has none.
    gpus_4 = DeviceListing(("cuda:0", "cuda:1", "cuda:2", "cuda:3"), "cpu:0", accelerators=True)
    with pytest.raises(errors.LaunchError, match=r"Include device 0 first .* CUDA_VISIBLE_DEVICES"):
        plan.decide("torch", gpus_4, [2, 3])  # refused by the plan, before any start
    assert plan.decide("torch", gpus_4, [0, 3]).device_indexes == (0, 3)
    assert plan.decide("torch", CPUS_4, 3).device_indexes == (0, 1, 2)
    # A scheduler's job starts its own processes, on its own devices.
    job = cluster.Environment("torchrun", 4, 2, local_rank=2, local_world_size=4)
    assert plan.decide("torch", gpus_4, None, job).device_indexes == ()


# Bad cluster input: refused with a clear error well within 60 s, before any
# process starts. Both "nodes" are this machine.
from agnostic.launch import nodes, rendezvous, settings  # noqa: E402

SECRET = b"a job secret for the tests"


@pytest.mark.parametrize("nproc, nnodes, rank, message", [
    (1, 2, 2, r"--node-rank 2 is out of range for --nnodes 2: use 0 to 1"),
    (1, 2, -1, r"--node-rank -1 is out of range"),
    (0, 1, 0, r"must be a whole number, at least 1"),
])
def test_launch_arguments_are_checked(nproc, nnodes, rank, message):
    with pytest.raises(errors.LaunchError, match=message):
        settings.settings(nproc, nnodes, rank, "127.0.0.1:29400")


@pytest.mark.parametrize("master", ["127.0.0.1", "host:port", ":29400", "h:70000"])
def test_master_must_be_host_and_port(master):
    with pytest.raises(errors.LaunchError, match=r"--master must be HOST:PORT"):
        settings.parse_master(master)


def test_unreachable_master_is_reported(monkeypatch):
    monkeypatch.setenv("AGNOSTIC_JOIN_SECONDS", "2")
    port = processes.free_port()  # nobody listens there
    began = time.monotonic()
    with pytest.raises(errors.LaunchError, match=f"Cannot reach the master 127.0.0.1:{port}"):
        rendezvous.Member("127.0.0.1", port, 1, 2, 1, SECRET)
    assert time.monotonic() - began < 60


def test_master_port_in_use_is_reported():
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(errors.LaunchError, match=f"Node 0 cannot listen on port {port} "
                                                     r"at 127\.0\.0\.1 .*--master 127\.0\.0\.1:PORT"):
            rendezvous.Leader("127.0.0.1", port, 2, 1, SECRET)


def test_a_node_that_never_joins_is_named(monkeypatch):
    monkeypatch.setenv("AGNOSTIC_JOIN_SECONDS", "1")
    leader = rendezvous.Leader("127.0.0.1", processes.free_port(), 3, 1, SECRET)
    with pytest.raises(errors.LaunchError, match=r"Node\(s\) \[1, 2\] did not join within 1 s"):
        leader.gather()


def test_nodes_that_disagree_are_refused():
    port = processes.free_port()
    leader = rendezvous.Leader("127.0.0.1", port, 2, 1, SECRET)
    failures = []
    thread = threading.Thread(target=lambda: _gather(leader, failures))
    thread.start()
    with pytest.raises(errors.LaunchError, match=r"--nproc-per-node 4, but node 0 .* 1"):
        rendezvous.Member("127.0.0.1", port, 1, 2, 4, SECRET).gather()
    thread.join(10)
    assert "Start every node with the same numbers" in failures[0]


def test_nodes_that_agree_get_the_whole_cluster():
    port = processes.free_port()
    leader = rendezvous.Leader("127.0.0.1", port, 2, 2, SECRET)
    clusters = []
    thread = threading.Thread(target=lambda: clusters.append(leader.gather()))
    thread.start()
    cluster = rendezvous.Member("127.0.0.1", port, 1, 2, 2, SECRET).gather()
    thread.join(10)
    assert cluster == clusters[0]
    assert cluster.world_size == 4 and cluster.first_rank(1) == 2
    env = nodes.environment(cluster, 1, 1, "127.0.0.1", port)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("3", "4", "1")
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "worker", "index": 3}
    assert env["KERAS_DISTRIBUTION_PROCESS_ID"] == "3"
    assert env["MASTER_PORT"] == str(port + 1)


def _gather(leader, failures):
    try:
        leader.gather()
    except errors.LaunchError as error:
        failures.append(str(error))


# A module run with `-m`, torchrun's underscore spellings: two real processes,
# each seeing its rank variables and its own arguments; no engine involved.
REPORT = """import json, os, sys
rank = os.environ["RANK"]
with open(f"rank_{rank}.json", "w") as handle:
    json.dump({"rank": int(rank), "world_size": os.environ["WORLD_SIZE"],
               "local_rank": os.environ["LOCAL_RANK"], "master_port": os.environ["MASTER_PORT"],
               "arguments": sys.argv[1:], "module": __spec__.name,
               "secret": os.environ.get("AGNOSTIC_JOB_SECRET")}, handle)
print(f"report from rank {rank}")
"""


def test_launch_runs_a_module_with_underscore_flags(tmp_path):
    (tmp_path / "tinypkg").mkdir()
    (tmp_path / "tinypkg" / "__init__.py").write_text("")
    (tmp_path / "tinypkg" / "report.py").write_text(REPORT)
    port = settings.free_master_port()
    # Run from the package's folder, as `python -m` finds modules there.
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "agnostic", "launch", "--nproc_per_node", "2",
         "--master_port", str(port), "-m", "tinypkg.report", "--lr", "0.1"],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=path, TMPDIR=str(tmp_path),
                               AGNOSTIC_JOB_SECRET=SECRET.decode()),
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    reports = sorted((json.loads(p.read_text()) for p in tmp_path.glob("rank_*.json")),
                     key=lambda report: report["rank"])
    assert [r["rank"] for r in reports] == [0, 1]
    assert [r["local_rank"] for r in reports] == ["0", "1"]
    for report in reports:
        assert report["world_size"] == "2" and report["master_port"] == str(port + 1)
        assert report["arguments"] == ["--lr", "0.1"]
        assert report["module"] == "tinypkg.report"
        assert report["secret"] is None  # the job's secret stays with the launcher
    assert "report from rank 0" in result.stdout  # the chief's output alone
    assert "report from rank 1" not in result.stdout
    # The other's is in the log folder the launcher made (tests/launch/test_output.py).
    [logs] = tmp_path.glob("agnostic-logs-*/attempt_0/rank_1")
    assert (logs / "stdout.log").read_text() == "report from rank 1\n"
