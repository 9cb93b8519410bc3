"""torch-ddp with real processes (gloo on CPU) and real signals."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import models, stalls
from tests.conftest import ROOT, alive, engine_or_skip, run_script

keras = engine_or_skip()
torch = pytest.importorskip("torch")

import agnostic  # noqa: E402
from agnostic.compat import torch_keras_ddp, versions  # noqa: E402
from agnostic.engines.torch import combined as torch_reduce  # noqa: E402

SCRIPT = os.path.join("tests", "scripts", "processes.py")
SCENARIO = os.path.join("tests", "scripts", "scenario.py")
BOUND_SECONDS = 60


def pids(folder):
    return [int(open(os.path.join(folder, name)).read())
            for name in os.listdir(folder) if name.startswith("pid_")]


def start(mode, folder):
    return subprocess.Popen(
        [sys.executable, SCRIPT, mode, str(folder)], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=as_in_a_terminal,
    )


def as_in_a_terminal():
    # A test run started in the background (`cmd &` without job control)
    # ignores Ctrl-C, and so would the script: give it a terminal's default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(path, process, seconds=180):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def finish(process, folder):
    """Waits for the launcher; checks the bound and that nothing is left."""
    began = time.monotonic()
    try:
        stdout, stderr = process.communicate(timeout=BOUND_SECONDS + 30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    elapsed = time.monotonic() - began
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids(folder)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids(folder) if alive(pid)]
    return process.returncode, stdout, stderr, elapsed, left


@pytest.mark.parametrize("mode, status", [("raise", "status 1"), ("sigkill", "status -9")])
def test_a_failing_worker_ends_every_process(mode, status, tmp_path):
    process = start(mode, tmp_path)
    code, _, stderr, elapsed, left = finish(process, tmp_path)
    assert code != 0
    assert elapsed < BOUND_SECONDS
    assert left == []
    assert len(pids(tmp_path)) == 2
    # The worker that failed first in cause is named, not rank 0, whose
    # collective failed because its peer had gone.
    assert f"(rank 1 of 2) exited with {status}" in stderr
    assert "rank 0 of 2 (process" in stderr and "failed after a peer had ended" in stderr
    if mode == "raise":  # the failing worker's traceback is shown, once
        assert stderr.count("RuntimeError: worker failure in rank 1") == 2  # + summary
        assert stderr.count("Traceback (most recent call last)") == 1
    # No traceback once per rank (torch's and the launcher's prefix: [rank1]: ...).
    assert "]: Traceback" not in stderr


def test_a_worker_that_aborts_in_teardown_after_its_work_has_finished(tmp_path):
    """torch's gloo threads can abort a process during the interpreter's
    teardown, after training has ended and the group was left: the launcher
    counts that worker as finished. Aborting before it left the group is
    still a failure, named by its signal."""
    process = start("teardown", tmp_path)
    code, _, stderr, elapsed, left = finish(process, tmp_path)
    assert code == 0, stderr
    assert elapsed < BOUND_SECONDS and left == []
    assert "Traceback" not in stderr
    (tmp_path / "before").mkdir()
    process = start("abort", tmp_path / "before")
    code, _, stderr, elapsed, left = finish(process, tmp_path / "before")
    assert code != 0 and left == []
    assert "(rank 1 of 2) exited with status -6: killed by signal SIGABRT" in stderr


def test_a_bug_every_process_meets_shows_one_traceback(tmp_path):
    process = start("everyone", tmp_path)
    code, _, stderr, elapsed, left = finish(process, tmp_path)
    assert code != 0 and elapsed < BOUND_SECONDS and left == []
    assert stderr.count("Traceback (most recent call last)") == 1
    assert stderr.count("ValueError: the same bug, met by rank") == 3  # traceback, 2 lines
    assert "Stopping the others." in stderr


@pytest.mark.parametrize("target", ["group", "launcher"])
def test_ctrl_c_stops_every_process(target, tmp_path):
    process = start("wait", tmp_path)
    wait_for(tmp_path / "started", process)
    if target == "group":  # what a terminal does
        os.killpg(process.pid, signal.SIGINT)
    else:
        os.kill(process.pid, signal.SIGINT)
    code, _, stderr, elapsed, left = finish(process, tmp_path)
    assert code != 0
    assert elapsed < BOUND_SECONDS
    assert left == []
    assert "KeyboardInterrupt" in stderr


def test_killing_the_launcher_leaves_no_worker(tmp_path):
    process = start("wait", tmp_path)
    wait_for(tmp_path / "started", process)
    os.kill(process.pid, signal.SIGKILL)
    code, _, _, _, left = finish(process, tmp_path)
    assert code == -signal.SIGKILL
    assert left == []


@pytest.mark.parametrize("rank", [0, 1])
def test_a_stopped_process_of_the_shim_is_ended_and_named(rank, tmp_path):
    """Rank 0 watches its workers; the workers watch rank 0 (the launcher,
    the process the user started), whose own output is stopped with it: a
    worker says why on rank 0's standard error, then ends it."""
    code, stderr, elapsed, left, pids = stalls.run_and_stop(
        [sys.executable, stalls.SCRIPT, str(tmp_path)], tmp_path, rank)
    assert stalls.STALL_SECONDS * 0.9 <= elapsed < stalls.BOUND_SECONDS, (elapsed, stderr)
    assert left == []
    if rank == 1:
        assert code == 1
        assert (f"worker process {pids[1]} (rank 1 of 2) exited with status -9: stopped "
                "answering on host ") in stderr, stderr[-3000:]
        assert "rank 0 of 2 (process" in stderr and "failed after a peer had ended" in stderr
    else:
        assert code == -signal.SIGKILL
        assert (f"agnostic: rank 0 (process {pids[0]}, the launcher) stopped answering on "
                "host ") in stderr and "ending it and its workers." in stderr, stderr[-3000:]
    assert "AGNOSTIC_STALL_SECONDS=5" in stderr
    # Its reports and heartbeats folder is gone, even when rank 0 could not remove it.
    assert not [name for name in os.listdir(tmp_path) if name.startswith("agnostic-failures")]


def test_a_stopped_process_under_torchrun_is_ended_and_named_by_a_peer(tmp_path):
    """torchrun's agent is not ours: the processes of a node watch each other."""
    from agnostic.launch.processes import free_port

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(free_port()), stalls.SCRIPT, str(tmp_path)]
    code, stderr, elapsed, left, pids = stalls.run_and_stop(command, tmp_path, 1)
    assert code == 1 and left == []
    assert stalls.STALL_SECONDS * 0.9 <= elapsed < stalls.BOUND_SECONDS, (elapsed, stderr)
    assert (f"agnostic: rank 1 (process {pids[1]}) stopped answering on host ") in stderr
    assert "so that torchrun stops the job." in stderr, stderr[-3000:]
    # torchrun's own summary names it as the root cause.
    cause = stderr.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in cause and f"(pid: {pids[1]})" in cause
    assert not [name for name in os.listdir(tmp_path) if name.startswith("agnostic-heartbeats")]


def test_only_the_chief_writes_files(tmp_path):
    result, stdout, _ = run_script(SCRIPT, "files", tmp_path)
    saved = result["saved"]
    assert "rank_0.weights.h5" in saved and "rank_1.weights.h5" not in saved
    assert {"epoch_1.keras", "epoch_2.keras", "log.csv"} <= set(saved)
    rows = open(tmp_path / "log.csv").read().strip().splitlines()
    assert rows[0].startswith("epoch") and len(rows) == 3  # one writer, no clobbering
    assert stdout.count("{") == 1  # one result printed
    assert stdout.count("printed by rank") == 1  # the workers' output is discarded
    # Every process ended its group before the interpreter's teardown.
    ended = [open(tmp_path / f"group_at_exit_{rank}").read() for rank in (0, 1)]
    assert ended == ["ended", "ended"]


def test_validation_split_and_pydataset_train_like_one_device(tmp_path):
    result, _, _ = run_script(SCRIPT, "inputs", tmp_path)
    assert result["validation_split"] < 1e-5
    np.testing.assert_allclose(*result["loss"], atol=1e-3)
    np.testing.assert_allclose(*result["val_loss"], atol=1e-3)  # over all the data
    assert result["pydataset"] < 1e-5


def test_joins_a_group_started_by_torchrun(tmp_path):
    from agnostic.launch.processes import free_port

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(free_port()), SCENARIO, "equivalence", "2", str(tmp_path)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-5000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # only the chief prints
    result = json.loads(lines[0])
    assert result["strategy"] == "torch-ddp"
    assert result["model_vs_reference"] < 1e-5
    np.testing.assert_allclose(*result["loss"], atol=1e-3)


def test_tensors_are_summed_in_buckets(monkeypatch):
    tensors = [torch.zeros(1000) for _ in range(10)]  # 4 kB each
    monkeypatch.setattr(torch_reduce, "BUCKET_BYTES", 10_000)
    buckets = list(torch_reduce.buckets(tensors))
    assert [len(b) for b in buckets] == [3, 3, 3, 1]
    flat = torch_reduce.flat(buckets[0])
    flat += 1
    torch_reduce.unflatten_into(flat, buckets[0])
    assert all(float(t.sum()) == 1000.0 for t in buckets[0])


def test_a_bucket_holds_one_dtype_so_integers_keep_every_bit():
    # A seed generator's int32 state beside float weights: joined with them
    # in one float32 tensor, 114706270 came back as 114706272 on every
    # process (an augmentation layer then drew other flips than one device).
    seed = torch.tensor([114706270, 0], dtype=torch.int32)
    tensors = [torch.zeros(3), seed, torch.ones(2)]
    buckets = list(torch_reduce.buckets(tensors))
    assert [[t.dtype for t in b] for b in buckets] == [[torch.float32] * 2, [torch.int32]]
    flat = torch_reduce.flat(buckets[1])
    torch_reduce.unflatten_into(flat, buckets[1])
    assert seed.tolist() == [114706270, 0]


@pytest.mark.keras_versions
def test_gradients_are_averaged_by_distributed_data_parallel(tmp_path):
    result, _, _ = run_script(SCRIPT, "gradients", tmp_path)
    # Same weights as one device, also after a backward pass outside fit on
    # one process only; torch's DistributedDataParallel averaged them while
    # backward ran, none at the optimizer: agnostic's where Keras trains each
    # process alone (3.13-3.15), Keras's own on 3.16 for its own train_step.
    keras_does = versions.parts(keras.__version__) >= (3, 16)
    plain = result["plain"]
    assert plain["difference"] < 1e-5
    assert (plain["parallel"], plain["at_optimizer"]) == ("DistributedDataParallel", 0)
    # Gradient accumulation (two backward passes per step, the guide's own
    # train_step on every Keras): averaged on each pass.
    halves = result["halves"]
    assert halves["difference"] < 1e-5
    assert (halves["parallel"], halves["at_optimizer"]) == ("DistributedDataParallel", 0)
    # A step that never calls the model (a GAN's calls its parts): averaged
    # when the optimizer gets them, every step (96 samples, 16 a step).
    parts = result["parts"]
    assert parts["difference"] < 1e-5
    assert (parts["parallel"], parts["at_optimizer"]) == ("NoneType", 6)
    # A model output that no loss uses: its weights get no gradient, which
    # DistributedDataParallel cannot finish; averaged at the optimizer from
    # the first step on (2 epochs of 6 steps). Keras 3.16's own wrapper stops
    # at the second step with torch's error there.
    if not keras_does:
        unused = result["unused"]
        assert unused["difference"] < 1e-5
        assert (unused["parallel"], unused["at_optimizer"]) == ("NoneType", 12)


def test_a_step_that_updates_weights_past_the_optimizer(tmp_path):
    result, _, stderr = run_script(SCRIPT, "manual", tmp_path)
    # Called through the model: DistributedDataParallel averaged the
    # gradients during backward, so a hand-written update trains as on one
    # device, and nothing is said.
    assert result["ManualUpdate"] < 1e-5
    # Through the layers only: nothing can average them; said once, by the
    # chief, and it did differ from one device.
    assert result["ManualParts"] > 1e-4
    assert stderr.count("UnaveragedGradientsWarning") == 1
    assert "ManualParts.train_step ran backward without calling the model" in stderr


class OwnStep(keras.Model):
    def train_step(self, data):  # the guide's custom step (never run here)
        return super().train_step(data)


@pytest.mark.keras_versions
def test_who_averages_follows_the_keras_version():
    # Keras 3.13-3.15 train each process alone: agnostic averages and sums.
    # Keras 3.16 wraps the model in DistributedDataParallel itself, which
    # averages only its own train_step's gradients.
    keras_does = versions.parts(keras.__version__) >= (3, 16)
    template = models.build(keras)
    assert torch_keras_ddp.keras_is_data_parallel(template) is keras_does
    assert torch_keras_ddp.keras_averages_gradients(template) is keras_does
    inputs = keras.Input((3,))
    own = OwnStep(inputs, keras.layers.Dense(1)(inputs))
    assert torch_keras_ddp.keras_is_data_parallel(own) is keras_does
    assert torch_keras_ddp.keras_averages_gradients(own) is False
    # The plan says so, decided once from the model, and torch-ddp reads it.
    for model, by in ((template, "keras" if keras_does else "agnostic"), (own, "agnostic")):
        chosen = agnostic.resolve(gpus=2, model=model)
        assert (chosen.gradients_by, chosen.keras_ddp) == (by, keras_does)
    assert agnostic.resolve(gpus=2).gradients_by is None  # no model: nothing to say


def test_a_keras_loss_over_an_empty_share_is_zero_only_within_such_a_step():
    # compat.torch_empty_share: Keras's loss of no rows is an empty tensor,
    # which backward refuses; in a step whose share is empty it is 0, joined
    # to the outputs (a zero gradient); elsewhere Keras's own, unchanged.
    from keras.src.losses import loss as losses

    from agnostic.compat import torch_empty_share

    keras_own = losses.reduce_values
    loss = keras.losses.SparseCategoricalCrossentropy()
    outputs = torch.zeros((0, 3), requires_grad=True)
    with torch_empty_share.when(True):
        assert losses.reduce_values is not keras_own
        inside = loss(torch.zeros((0,), dtype=torch.int64), torch.softmax(outputs, -1))
        one_row = loss(torch.zeros((1,), dtype=torch.int64), torch.full((1, 3), 1 / 3))
    outside = loss(torch.zeros((0,), dtype=torch.int64), torch.softmax(outputs, -1))
    assert inside.shape == () and float(inside) == 0.0
    inside.backward()
    assert outputs.grad is not None and outputs.grad.shape == (0, 3)
    assert float(one_row) == pytest.approx(np.log(3), rel=1e-5)  # a row: Keras's own
    assert tuple(outside.shape) == (0,)  # Keras's own, unchanged outside such a step
    assert losses.reduce_values is keras_own  # put back: nothing left replaced


def test_at_exit_the_group_ends_after_torchs_threads_had_python_to_themselves(monkeypatch):
    # gloo's threads free the last collective's tensors after the program
    # has its result, taking Python's lock; in the interpreter's teardown
    # that aborts the process (-6 after its work was done). Ending the group
    # first waits with the lock released: another thread runs meanwhile.
    # (The race itself is torch's; its timing is not reproducible in a test.)
    import threading

    from agnostic.engines.torch import join

    runs, stop, seen = [0], threading.Event(), []

    def busy():  # wants Python's lock all the time, as a waiting thread does
        while not stop.is_set():
            runs[0] += 1

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda: seen.append(runs[0]))
    thread = threading.Thread(target=busy)
    thread.start()
    try:
        before = runs[0]
        join._leave_group()
    finally:
        stop.set()
        thread.join()
    assert len(seen) == 1 and seen[0] > before, (before, seen)
