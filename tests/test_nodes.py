"""Several machines, simulated by two "nodes" on 127.0.0.1: two `agnostic
launch` processes with their own ports, each starting its script's processes
on the engine's own distributed runtime (JAX, torch). The second machine's
address is the only thing faked here: both nodes are this machine."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from tests.conftest import ROOT, alive, engine_or_skip

engine_or_skip()

from agnostic.launch.local import free_port  # noqa: E402

ENGINE = os.environ.get("KERAS_BACKEND")
# Devices per node: JAX splits each process's CPU in two, torch runs one
# process per device.
DEVICES_PER_NODE = {"jax": 2, "torch": 1, "tensorflow": 1}[ENGINE]
REPLICAS = 2 * DEVICES_PER_NODE
BOUND_SECONDS = 60


def start_node(rank, port, script, *arguments):
    env = dict(os.environ, AGNOSTIC_CPU_DEVICES=str(DEVICES_PER_NODE),
               AGNOSTIC_TEST_REPLICAS=str(REPLICAS))
    command = [sys.executable, "-m", "agnostic", "launch", "--nproc-per-node", "1",
               "--nnodes", "2", "--node-rank", str(rank), "--master", f"127.0.0.1:{port}",
               script] + [str(a) for a in arguments]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(nodes, seconds=600):
    began = time.monotonic()
    outputs = []
    for node in nodes:
        try:
            outputs.append(node.communicate(timeout=seconds))
        finally:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    return [n.returncode for n in nodes], outputs, time.monotonic() - began


if ENGINE in ("jax", "torch"):

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
        assert f"process 0 of {2 if ENGINE == 'jax' else REPLICAS}" in result["logs"][0]
        assert result["model_vs_reference"] < 1e-5
        np.testing.assert_allclose(*result["loss"], atol=1e-3)
        np.testing.assert_allclose(*result["evaluate"], atol=1e-5)

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

else:

    def test_tensorflow_workers_are_refused_before_training(tmp_path):
        # Keras 3.15 fails inside fit under MultiWorkerMirroredStrategy; the
        # shim says so before anything trains, on every node.
        port = free_port()
        script = os.path.join("tests", "scripts", "scenario.py")
        nodes = [start_node(rank, port, script, "equivalence", 2, tmp_path) for rank in (0, 1)]
        codes, outputs, elapsed = finish(nodes, seconds=BOUND_SECONDS + 30)
        assert all(code != 0 for code in codes)
        assert elapsed < BOUND_SECONDS
        assert "cannot train under MultiWorkerMirroredStrategy" in outputs[0][1]
