"""Preemption under SLURM: srun passes a signal to every task (as `sbatch
--signal=USR1@90` has SLURM send it before the time limit), here on two
"nodes" of the local cluster, for each engine's own multi-process runtime
(torch's process group, JAX's processes, TensorFlow's workers). Every task
stops after the same step, the chief writes the backup there, every task
exits with 128 + the signal's number, and the rerun ends with one device's
weights. Both "nodes" are this machine: the only thing faked."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import models
from tests.conftest import ROOT
from tests.schedulers.test_training import DEVICES, ENGINES, srun, variables

SCRIPT = os.path.join(ROOT, "tests", "scripts", "preempt.py")


def weights(folder):
    return models.saved_weights(os.path.join(str(folder), "final.npz"))


def stopped_at(engine):
    """(epoch, batches trained in it) of the backup, for a signal that reached
    the chief as step 1 of epoch 2 ended (4 epochs of 6 steps)."""
    if engine == "torch":  # its all-reduce of the flags is read a step later
        return 2, 4
    # JAX and TensorFlow agree every 10 train-function calls (blocking
    # collectives): after call 20, the second step of epoch 3.
    return 3, 2


@pytest.mark.parametrize("engine", ENGINES)
def test_a_signal_from_slurm_stops_every_task_at_one_step(slurm_cluster, engine, tmp_path):
    env = slurm_cluster.environ(dict(variables(engine), BACKUP="epoch", MARK="2:1",
                                     AGNOSTIC_PREEMPT_SIGNAL="USR1", TMPDIR=str(tmp_path)))
    command = srun(engine) + [sys.executable, SCRIPT, str(tmp_path)]
    job = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (tmp_path / "marker").exists():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
        time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)  # srun passes it on to every task
    _, err = job.communicate(timeout=240)
    assert job.returncode == 128 + signal.SIGUSR1, err[-3000:]
    assert not (tmp_path / "final.npz").exists()
    state = json.loads((tmp_path / "backup" / "agnostic_backup.json").read_text())
    assert (state["epoch"], state["batch"]) == stopped_at(engine)
    assert [n for n in os.listdir(tmp_path) if n.startswith("agnostic-")] == []

    (tmp_path / "marker").unlink()
    env.pop("MARK")
    rerun = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    epoch = stopped_at(engine)[0]
    assert json.loads(rerun.stdout.strip().splitlines()[-1])["epochs"] == list(range(epoch, 4))
    # One device, in one process, uninterrupted.
    alone = tmp_path / "alone"
    alone.mkdir()
    one = dict(os.environ, KERAS_BACKEND=engine, AGNOSTIC_TEST_REPLICAS="1",
               PYTHONPATH=ROOT, TMPDIR=str(tmp_path))
    one.pop("AGNOSTIC_CPU_DEVICES", None)
    reference = subprocess.run([sys.executable, SCRIPT, str(alone)], env=one, cwd=ROOT,
                               capture_output=True, text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert models.relative_difference(weights(alone), weights(tmp_path)) < 1e-5
