"""Several machines, simulated by two "nodes" on 127.0.0.1: two `agnostic
launch` processes with their own ports, each starting its script's processes
on the engine's own distributed runtime (TensorFlow, JAX, torch). The second
machine's address is the only thing faked here: both nodes are this machine."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from tests import jobs, models, stalls
from tests.jobs import finish
from tests.conftest import ROOT, alive, engine_or_skip

engine_or_skip()

from agnostic.launch.processes import free_port  # noqa: E402

ENGINE = os.environ.get("KERAS_BACKEND")
# Devices per node: JAX splits each process's CPU in two; torch runs one
# process per device; a TensorFlow worker computes on its one CPU.
DEVICES_PER_NODE = {"jax": 2, "torch": 1, "tensorflow": 1}[ENGINE]
REPLICAS = 2 * DEVICES_PER_NODE
BOUND_SECONDS = 60


def start_node(rank, port, script, *arguments, **variables):
    env = dict(os.environ, AGNOSTIC_CPU_DEVICES=str(DEVICES_PER_NODE),
               AGNOSTIC_TEST_REPLICAS=str(REPLICAS),
               AGNOSTIC_JOB_SECRET="the two test nodes' job secret", **variables)
    command = [sys.executable, "-m", "agnostic", "launch", "--nproc-per-node", "1",
               "--nnodes", "2", "--node-rank", str(rank), "--master", f"127.0.0.1:{port}",
               script] + [str(a) for a in arguments]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_two_nodes_train_like_one_device(tmp_path):
    port = free_port()
    script = os.path.join("tests", "scripts", "scenario.py")
    nodes = [start_node(rank, port, script, "equivalence", REPLICAS, tmp_path)
             for rank in (0, 1)]
    codes, outputs, _ = finish(nodes)
    assert codes == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
    lines = [l for out, _ in outputs for l in out.splitlines() if l.startswith("{")]
    assert len(lines) == 1  # the chief alone prints
    result = json.loads(lines[0])
    assert result["num_replicas"] == REPLICAS
    processes = 2 if ENGINE == "jax" else REPLICAS
    assert f"processes={processes} environment=agnostic-launch" in result["logs"][0]
    assert result["model_vs_reference"] < 1e-5
    np.testing.assert_allclose(*result["loss"], atol=1e-3)
    np.testing.assert_allclose(*result["evaluate"], atol=1e-5)
    assert result["predict"] < 1e-5  # every sample, in order


# The launchers' supervision and output, the same on every engine: run on
# torch, whose processes start fastest. (That only the chief writes files and
# shows progress on each engine's processes: tests/cluster/test_kubeflow.py
# and the schedulers' tests.) And two nodes on one shared disk resuming
# from the backup every process finds there: every engine restores through
# the chief's copy, as nodes without a shared disk do (below, and on every
# engine tests/resume/test_backup_disks.py).
if ENGINE == "torch":

    def test_a_run_killed_on_one_node_resumes_from_its_backup(tmp_path):
        script = os.path.join("tests", "scripts", "checkpoints.py")

        def run(folder, **kill):
            port = free_port()
            nodes = [start_node(rank, port, script, "resume", REPLICAS, folder, **kill)
                     for rank in (0, 1)]
            return finish(nodes)

        whole, broken = tmp_path / "whole", tmp_path / "broken"
        broken.mkdir()
        jobs.uninterrupted("resume", REPLICAS, whole)  # on this machine's devices
        codes, _, _ = run(broken, KILL="2:3")  # the process of rank 1, on node 1
        assert all(code != 0 for code in codes) and not (broken / "final.npz").exists()
        codes, outputs, _ = run(broken)
        assert codes == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
        assert '"epochs": [2, 3]' in outputs[0][0]
        weights = [models.saved_weights(folder / "final.npz") for folder in (whole, broken)]
        assert models.relative_difference(*weights) < 1e-5

    def test_only_the_chief_writes_files_and_shows_progress(tmp_path):
        port = free_port()
        script = os.path.join("tests", "scripts", "processes.py")
        nodes = [start_node(rank, port, script, "files", tmp_path) for rank in (0, 1)]
        codes, outputs, _ = finish(nodes)
        assert codes == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
        lines = [l for l in outputs[0][0].splitlines() if l.startswith("{")]
        saved = json.loads(lines[0])["saved"]
        assert "rank_0.weights.h5" in saved and not [n for n in saved if n.startswith("rank_1")]
        assert {"epoch_1.keras", "epoch_2.keras", "log.csv"} <= set(saved)
        rows = (tmp_path / "log.csv").read_text().strip().splitlines()
        assert rows[0].startswith("epoch") and len(rows) == 3  # one writer
        printed = outputs[0][0] + outputs[1][0]
        assert printed.count("Epoch 1/2") == 1 and printed.count("{") == 1
        assert printed.count("printed by rank") == 1  # the chief's output alone


    def test_a_killed_worker_ends_every_node(tmp_path):
        port = free_port()
        script = os.path.join("tests", "scripts", "processes.py")
        nodes = [start_node(rank, port, script, "sigkill", tmp_path) for rank in (0, 1)]
        deadline = time.monotonic() + 300
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline and all(n.poll() is None for n in nodes)
            time.sleep(0.1)
        codes, outputs, elapsed = finish(nodes, seconds=BOUND_SECONDS + 30)
        assert all(code != 0 for code in codes)
        assert elapsed < BOUND_SECONDS
        stderr = outputs[0][1] + outputs[1][1]
        assert "(rank 1, node 1) exited with status -9" in stderr
        time.sleep(1)
        pids = [int(open(tmp_path / name).read()) for name in os.listdir(tmp_path)
                if name.startswith("pid_")]
        assert pids and not [pid for pid in pids if alive(pid)]


    def test_a_stopped_process_on_one_node_is_named_on_every_node(tmp_path):
        """Node 1's launcher sees its process silent and tells node 0's."""
        port = free_port()
        nodes = [start_node(rank, port, stalls.SCRIPT, tmp_path, AGNOSTIC_STALL_SECONDS="5")
                 for rank in (0, 1)]
        paths = [tmp_path / "pid_0", tmp_path / "pid_1"]
        deadline = time.monotonic() + 300
        while not all(path.exists() for path in paths):
            assert time.monotonic() < deadline and all(n.poll() is None for n in nodes)
            time.sleep(0.1)
        pids = [int(path.read_text()) for path in paths]
        os.kill(pids[1], signal.SIGSTOP)
        try:
            codes, outputs, elapsed = finish(nodes, seconds=stalls.BOUND_SECONDS + 30)
        finally:
            if alive(pids[1]):
                os.kill(pids[1], signal.SIGKILL)
        assert codes == [1, 1] and elapsed < stalls.BOUND_SECONDS
        named = f"worker process {pids[1]} (rank 1, node 1) stopped answering on host "
        assert named in outputs[1][1]  # its node's launcher
        assert named in outputs[0][1] and "stopping this node's processes" in outputs[0][1]
        time.sleep(1)
        assert not [pid for pid in pids if alive(pid)]


if ENGINE == "tensorflow":  # TF_CONFIG is TensorFlow's

    def test_tensorflow_workers_from_a_hand_written_tf_config(tmp_path):
        # No launcher: two processes started as a user would, each with its own
        # TF_CONFIG; agnostic's start-up hook makes their strategy.
        ports = [free_port(), free_port()]
        script = os.path.join("tests", "scripts", "scenario.py")
        workers = []
        for index in (0, 1):
            config = {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                      "task": {"type": "worker", "index": index}}
            env = dict(os.environ, TF_CONFIG=json.dumps(config), AGNOSTIC_TEST_REPLICAS="2")
            env.pop("AGNOSTIC_CPU_DEVICES", None)
            workers.append(subprocess.Popen(
                [sys.executable, script, "equivalence", "2", str(tmp_path)],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True))
        codes, outputs, _ = finish(workers)
        assert codes == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
        lines = [l for out, _ in outputs for l in out.splitlines() if l.startswith("{")]
        assert len(lines) == 1
        result = json.loads(lines[0])
        assert result["strategy"] == "tf-multi-worker" and result["num_replicas"] == 2
        assert result["model_vs_reference"] < 1e-5
        assert result["template_vs_reference"] < 1e-5
        np.testing.assert_allclose(*result["loss"], atol=1e-3)
        np.testing.assert_allclose(*result["evaluate"], atol=1e-5)
        assert result["predict"] < 1e-5


if ENGINE != "torch":  # torchrun and agnostic launch meet before torch starts

    def test_a_process_whose_peers_never_start_ends_within_the_bound(tmp_path):
        # Set by hand, without the launcher (which starts every process
        # together): this process's peer never starts. The engine's runtime would
        # wait without limit (TensorFlow) or for 5 minutes (JAX).
        port = free_port()
        env = dict(os.environ, AGNOSTIC_JOIN_SECONDS="5")
        env.pop("AGNOSTIC_CPU_DEVICES", None)
        if ENGINE == "tensorflow":
            env["TF_CONFIG"] = json.dumps({
                "cluster": {"worker": [f"127.0.0.1:{port}", f"127.0.0.1:{free_port()}"]},
                "task": {"type": "worker", "index": 0}})
        else:
            env.update(KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                       KERAS_DISTRIBUTION_NUM_PROCESSES="2", KERAS_DISTRIBUTION_PROCESS_ID="0")
        script = os.path.join("tests", "scripts", "scenario.py")
        began = time.monotonic()
        result = subprocess.run([sys.executable, script, "equivalence", "2", str(tmp_path)],
                                cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=BOUND_SECONDS + 60)
        assert result.returncode != 0
        assert time.monotonic() - began < BOUND_SECONDS
        if ENGINE == "tensorflow":
            assert "(from tf-config) did not reach every worker within 5 s" in result.stderr
            # The peer that never started is named (its port does not answer).
            assert "Not answering: worker 1 at 127.0.0.1:" in result.stderr
            assert "AGNOSTIC_JOIN_SECONDS" in result.stderr


def test_every_process_of_every_node_loads_the_file_just_saved(tmp_path):
    # tests/programs/save_then_load.py saves, then loads, twice, in every process.
    port = free_port()
    script = os.path.join("tests", "programs", "save_then_load.py")
    nodes = [start_node(rank, port, script, "agnostic", tmp_path) for rank in (0, 1)]
    codes, outputs, _ = finish(nodes)
    assert codes == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
    loads = sorted(name for name in os.listdir(tmp_path) if "loaded-by" in name)
    assert loads == ["agnostic-loaded-by-0.txt", "agnostic-loaded-by-1.txt"]
    for name in loads:
        assert float(open(tmp_path / name).read()) == 0.0, name


def test_batch_normalization_over_two_nodes_uses_the_global_batch(tmp_path):
    from tests.conftest import run_plain
    from tests.test_programs import relative_difference

    script = os.path.join("tests", "programs", "batchnorm_cnn.py")
    run_plain(script, tmp_path)
    port = free_port()
    nodes = [start_node(rank, port, script, "agnostic", tmp_path) for rank in (0, 1)]
    codes, outputs, _ = finish(nodes)
    assert codes == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
    plain, agnostic = (np.load(tmp_path / f"{mode}.npz") for mode in ("plain", "agnostic"))
    names = sorted(plain.files, key=lambda key: int(key.split("_")[1]))
    assert relative_difference([plain[n] for n in names], [agnostic[n] for n in names]) < 1e-5
    report = json.loads((tmp_path / "agnostic.json").read_text())
    assert report["replica_spread"] == 0.0  # every process's moving statistics alike


# Two nodes on disks of their own, resumed: torch only. On every engine the
# chief's backup crosses to the other node through its collectives in
# tests/resume/test_backup_disks.py, and a killed run resumes in
# tests/resume/test_checkpoints.py; what this run adds (the kill, the
# processes agreeing on the epoch) is the launcher's and agnostic's own.
if ENGINE == "torch":

    def test_nodes_without_a_shared_disk_resume_from_the_chiefs_backup(tmp_path):
        # Each node backs up to a folder of its own, as machines without a shared
        # disk do: after the kill only the chief's folder holds a backup, and every
        # process must still resume at its epoch, with its weights and momentum.
        script = os.path.join("tests", "scripts", "checkpoints.py")

        def run(folder, seconds=600, **kill):
            port = free_port()
            nodes = [start_node(rank, port, script, "own-folders", REPLICAS, folder,
                                NODE_FOLDER=str(folder / f"node{rank}"), **kill)
                     for rank in (0, 1)]
            return finish(nodes, seconds)

        def files_under(folder):
            return [name for _, _, names in os.walk(folder) for name in names]

        def final(folder, rank):
            return models.saved_weights(folder / f"final-{rank}.npz")

        def epochs(folder, rank):
            return json.loads((folder / f"epochs-{rank}.json").read_text())

        whole, broken = tmp_path / "whole", tmp_path / "broken"
        (broken / "node0").mkdir(parents=True), (broken / "node1").mkdir()
        # Uninterrupted, on this machine's devices (two nodes train like one).
        jobs.uninterrupted("own-folders", REPLICAS, whole, NODE_FOLDER="node0")
        assert epochs(whole, 0) == [0, 1]
        codes, _, _ = run(broken, KILL="1:3")  # the process of rank 1, in epoch 1
        assert all(code != 0 for code in codes) and not list(broken.glob("final-*"))
        assert "agnostic_backup.json" in files_under(broken / "node0")
        assert files_under(broken / "node1") == []
        # Bounded: processes that disagree on the epoch wait for each other.
        codes, outputs, _ = run(broken, seconds=300)
        assert codes == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
        assert epochs(broken, 0) == epochs(broken, 1) == [1]
        assert models.relative_difference(final(whole, 0), final(broken, 0)) < 1e-5
        assert models.relative_difference(final(broken, 0), final(broken, 1)) < 1e-5
        assert files_under(broken / "node1") == []


def test_the_chiefs_value_crosses_whole_as_int32_words():
    # Both processes' sides of collectives.share, one after the other: the
    # chief's broadcasts are what the other process receives, whatever it passed.
    from agnostic import collectives

    sent = []

    def chief(array):
        sent.append(np.array(array))
        return array

    def other(array):
        received = sent.pop(0)
        assert received.shape == array.shape and received.dtype == np.int32
        return received

    for value in (None, {"epoch": 3, "weights": b"\x00\xff" * 1001}, b"x" * 4, b"y" * 5):
        assert collectives._through_arrays(value, True, chief) == value
        assert collectives._through_arrays("not the chief's", False, other) == value
        assert not sent
