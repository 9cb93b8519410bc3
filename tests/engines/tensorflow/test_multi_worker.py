"""tf-multi-worker: two real TensorFlow worker processes (TF_CONFIG written
by hand, both on 127.0.0.1): ordinary programs train on them as on one
device, batches of any size included; and a program that makes its own
MultiWorkerMirroredStrategy, as Ray's and TensorFlow's guides do, trains in
it beside the one agnostic makes as the worker joins its job; a worker
paused past TensorFlow's heartbeat bound does not end the job."""
import json
import os
import signal
import sys
import time

import numpy as np
import pytest

from tests import jobs, models, warm
from tests.conftest import engine_or_skip, run_plain

engine_or_skip()

from tests.test_programs import (PROGRAMS, assert_odd_batches_like_one_device,  # noqa: E402
                                 assert_same_history, assert_same_training, load_run)

from agnostic.launch.processes import free_ports  # noqa: E402

SCRIPT = os.path.join("tests", "scripts", "own_strategy.py")
PREEMPT = os.path.join("tests", "scripts", "preempt.py")
LATE = 8  # seconds the chief waits between the two strategies
BOUND = 240  # a run takes about 15 s on 2 cores (8 of them waiting)


def tf_config(ports, index):
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
                       "task": {"type": "worker", "index": index}})


def on_two_workers(name, folder, **variables):
    """A program (tests/programs/) run plainly on one device, then through
    agnostic on two TensorFlow workers: (plain, agnostic, each worker's stderr).
    The workers are forks of the warm interpreter (tests/warm.py) where the
    test's variables allow, as the programs' runs are: the harness imports
    agnostic after Keras in either, and agnostic reads TF_CONFIG then."""
    script = os.path.join(PROGRAMS, name + ".py")
    run_plain(script, folder, env=variables)
    ports = free_ports(2)
    python = warm.python() if warm.serves(script, variables) else sys.executable
    workers = [jobs.start([python, script, "agnostic", folder], TF_CONFIG=tf_config(ports, i),
                          AGNOSTIC_CPU_DEVICES=None, AGNOSTIC_TEST_REPLICAS="2",
                          TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
                          PYTHONPATH=os.environ.get("PYTHONPATH"), **variables)
               for i in (0, 1)]
    codes, outputs, _ = jobs.finish(workers, seconds=BOUND)
    jobs.succeeded(codes, outputs)
    return load_run(folder, "plain"), load_run(folder, "agnostic"), [err for _, err in outputs]


# 33 rows a batch over 331 (shares of 17 and 16, then a last batch of one
# row: one worker gets none). One run: each costs two workers' start.
@pytest.mark.parametrize("batch, rows", [("33", "331")])
def test_batches_of_any_size_train_like_one_device(tmp_path, batch, rows):
    # fit (arrays, validation_data, a PyDataset), evaluate, predict and the
    # *_on_batch methods, with BatchNormalization over the global batch.
    plain, agnostic, stderr = on_two_workers("odd_batches", tmp_path, PROGRAM_BATCH=batch,
                                             PROGRAM_ROWS=rows)
    assert "strategy=tf-multi-worker replicas=2 processes=2" in stderr[0]
    assert_odd_batches_like_one_device(plain, agnostic)


@pytest.mark.parametrize("accumulate", ["1", "0"])
def test_one_devices_gradient_arithmetic(tmp_path, accumulate):
    # Global-norm clipping on the global batch's gradient, a moving average of
    # the weights, AdamW on sparse gradients (a position embedding shared by
    # the batch, a token embedding), a compute_loss term, add_loss and a
    # regularizer, in batches of 33, with accumulation over 2 steps and
    # without (then the sparse gradients reach the optimizer as they are):
    # the optimizer's apply runs once, across both workers, on the sum.
    plain, agnostic, _ = on_two_workers("gradient_arithmetic", tmp_path,
                                        PROGRAM_ACCUMULATE=accumulate)
    assert_same_training(plain, agnostic)
    assert_same_history(plain, agnostic)
    np.testing.assert_allclose(agnostic["predictions"], plain["predictions"], atol=1e-5)
    assert agnostic["iterations"] == plain["iterations"]


@pytest.mark.parametrize("name", ["whole_batch_losses", "gan", "raw_text"])
def test_each_workers_step_sees_the_whole_global_batch(tmp_path, name):
    # reduction="sum", a sample-weighted mean and a batch-mean loss on
    # batches of 33; the keras.io GAN drawing its noise in its step; a text
    # model taking raw strings (the workers' collectives carry no strings:
    # "DataType string not in list of allowed values"): the step's data
    # gathered from both workers (agnostic/fit/global_batch.py).
    plain, agnostic, _ = on_two_workers(name, tmp_path)
    assert_same_training(plain, agnostic)
    assert_same_history(plain, agnostic)


def test_several_steps_per_execution_run_one_per_call_said_once(tmp_path):
    # Keras's loop of several steps per call fails under the workers'
    # strategy, with or without agnostic: one step per call, the same training.
    plain, agnostic, stderr = on_two_workers("steps_per_execution", tmp_path)
    assert_same_training(plain, agnostic)
    assert_same_history(plain, agnostic)
    assert [err.count("StepsPerExecutionWarning") for err in stderr] == [1, 0]
    assert "not steps_per_execution=4" in stderr[0]
    # Said at the program's compile line (the harness's call), not in agnostic.
    said = next(line for line in stderr[0].splitlines() if "StepsPerExecutionWarning" in line)
    assert said.split(":")[0].endswith("harness.py"), said


def test_the_fit_guides_step_reports_one_device_numbers_after_each_batch(tmp_path):
    # The guide's own train_step returning {m.name: m.result()}, batches of
    # 33: each metric is summed over both workers' shares in the step, so the
    # logs after each batch (16 of them), the history and evaluate are one
    # device's, not the mean of the workers' own results.
    plain, agnostic, _ = on_two_workers("guide_fit_step", tmp_path)
    assert len(plain["batches"]) == 2 * 8
    assert_same_training(plain, agnostic)
    assert_same_history(plain, agnostic)
    np.testing.assert_allclose(agnostic["batches"], plain["batches"], atol=1e-5)
    for key, value in plain["evaluation"].items():
        np.testing.assert_allclose(agnostic["evaluation"][key], value, rtol=1e-5, err_msg=key)


@pytest.mark.parametrize("order", ["agnostic-first", "own-first"])
def test_a_program_with_its_own_strategy_trains_in_it_whoever_is_late(tmp_path, order):
    # TensorFlow 2.21 starts the worker's collective runtime again for each
    # strategy made: the chief's second start, after the other worker's first
    # all-reduce has reached it, left that all-reduce waiting for ever (CI met
    # it under Ray, where the timing is chance; here the chief is late).
    ports = free_ports(2)
    workers = [jobs.start(jobs.python(SCRIPT, order, LATE, tmp_path),
                          TF_CONFIG=tf_config(ports, index), AGNOSTIC_CPU_DEVICES=None,
                          TF_CPP_MIN_LOG_LEVEL="2") for index in (0, 1)]
    codes, outputs, _ = jobs.finish(workers, seconds=BOUND)
    jobs.succeeded(codes, outputs)
    results = [json.loads((tmp_path / f"result_{index}.json").read_text())
               for index in (0, 1)]
    weights = {name: models.saved_weights(tmp_path / f"weights_{name}.npz")
               for name in ("0", "1", "one_device")}
    for index, result in enumerate(results):
        assert result["users_strategy"], result  # trained under the program's own
        assert models.relative_difference(weights["one_device"], weights[str(index)]) < 1e-5
        np.testing.assert_allclose(result["loss"], results[0]["one_device_loss"], atol=1e-4)


PAUSE = 15  # seconds: past TensorFlow's 10 s bound for a late heartbeat, within agnostic's


def test_a_worker_paused_past_tensorflows_heartbeat_bound_does_not_end_the_job(tmp_path):
    # A worker alive but given no CPU for a while (a busy host; here SIGSTOP)
    # sends no heartbeat: at TensorFlow's default the chief's coordination
    # service ended the job 10 s on (CI met it on a loaded 2-core machine,
    # "Task /job:worker/replica:0/task:0 heartbeat timeout"); agnostic's
    # workers wait 100 s, as JAX's do, so the job goes on.
    ports = free_ports(2)
    workers = [jobs.start(jobs.python(PREEMPT, tmp_path), TF_CONFIG=tf_config(ports, index),
                          AGNOSTIC_CPU_DEVICES=None, AGNOSTIC_TEST_REPLICAS="2",
                          TF_CPP_MIN_LOG_LEVEL="2", MARK="1:1", MARK_SECONDS="0")
               for index in (0, 1)]
    try:
        deadline = time.monotonic() + BOUND
        while not (tmp_path / "marker").exists():  # the chief's step 1 of epoch 1 ended
            assert all(w.poll() is None for w in workers) and time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(workers[1].pid, signal.SIGSTOP)
        time.sleep(PAUSE)
    finally:
        os.kill(workers[1].pid, signal.SIGCONT)
    codes, outputs, _ = jobs.finish(workers, seconds=BOUND)
    jobs.succeeded(codes, outputs)
    assert jobs.chief_result(outputs)["epochs"] == [0, 1, 2, 3]
