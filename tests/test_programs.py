"""Ordinary Keras programs (tests/programs/) train the same through agnostic
on 2 devices as with plain `model.compile` on one device, on every engine."""
import json
import os

import numpy as np
import pytest
from tests import warm
from tests.conftest import engine_or_skip, run_plain, run_program, run_script

keras = engine_or_skip()

ENGINE = keras.backend.backend()
PROGRAMS = os.path.join("tests", "programs")
# The reduced suite each other tested Keras version runs (tox.ini).
VERSIONS = pytest.mark.keras_versions


def run_both(name, folder, env=None, both=False):
    """Runs a program plainly, then through agnostic (with `env`; the plain
    run too when `both`)."""
    script = os.path.join(PROGRAMS, name + ".py")
    results = {}
    for mode in ("plain", "agnostic"):
        if mode == "plain":
            run_plain(script, folder, env=env if both else None)
        else:
            run_program(script, mode, folder, env=env)
        results[mode] = load_run(folder, mode)
    return results["plain"], results["agnostic"]


def load_run(folder, mode):
    """What a program's chief wrote into `folder`: its report, and its weights
    (in the model's order) under "weights"."""
    with open(os.path.join(folder, mode + ".json")) as handle:
        report = json.load(handle)
    weights = np.load(os.path.join(folder, mode + ".npz"))
    report["weights"] = [weights[key] for key in sorted(weights.files, key=_number)]
    return report


def _number(key):
    return int(key.split("_")[1])


def relative_difference(expected, actual):
    largest = max(float(np.abs(w).max()) for w in expected)
    return max(float(np.abs(a - b).max()) for a, b in zip(expected, actual)) / largest


def assert_same_training(plain, agnostic, weights=1e-5, logs=1e-3):
    assert len(plain["weights"]) == len(agnostic["weights"])
    assert relative_difference(plain["weights"], agnostic["weights"]) < weights
    assert plain["history"].keys() == agnostic["history"].keys()
    for key, values in plain["history"].items():
        np.testing.assert_allclose(agnostic["history"][key], values, rtol=logs, atol=logs,
                                   err_msg=key)
    if plain["evaluation"] is not None:
        expected, actual = plain["evaluation"], agnostic["evaluation"]
        if isinstance(expected, dict):
            assert expected.keys() == actual.keys()
            expected, actual = list(expected.values()), [actual[k] for k in expected]
        np.testing.assert_allclose(actual, expected, rtol=logs, atol=logs)


def assert_same_history(plain, agnostic, tolerance=1e-5):
    """Tighter than assert_same_training's 1e-3: a deterministic run's logs
    are one device's to float32 rounding, so a log of part of the batch (a
    process's own share) shows here."""
    for key, values in plain["history"].items():
        np.testing.assert_allclose(agnostic["history"][key], values, rtol=tolerance,
                                   err_msg=key)


# device_parallel.py names agnostic: in a fresh process the start-up hook
# imports it as the engine is imported, in a warm one its own import line
# does, after Keras (on torch its workers are forks too). A plain run comes
# from the same fork as these.
@pytest.mark.parametrize("name", ["batchnorm_cnn", "device_parallel"])
def test_a_warm_run_is_the_run_of_a_fresh_process(name, tmp_path):
    # Every test's runs of a program or script come from forks of a warm
    # interpreter where they may (tests/warm.py): each must be the run
    # `python program MODE` makes.
    script = os.path.join(PROGRAMS, name + ".py")
    fresh, forked = tmp_path / "fresh", tmp_path / "warm"
    fresh.mkdir(), forked.mkdir()
    env = {"AGNOSTIC_TEST_REPLICAS": "2"}
    run_script(script, "agnostic", fresh, env=env, fresh=True)
    assert warm.serves(script, env)
    run_program(script, "agnostic", forked, env=env)
    if name == "batchnorm_cnn":  # torch's worker (rank 1): a fork too
        assert warm.LAST["workers"] == (1 if ENGINE == "torch" else 0)
    assert json.loads((forked / "agnostic.json").read_text()) == json.loads(
        (fresh / "agnostic.json").read_text())
    expected, actual = np.load(fresh / "agnostic.npz"), np.load(forked / "agnostic.npz")
    assert expected.files == actual.files
    for key in expected.files:
        np.testing.assert_array_equal(actual[key], expected[key])
    # A variable read at import starts a fresh process.
    assert not warm.serves(script, {"AGNOSTIC_CPU_DEVICES": "2"})


def test_a_warm_run_ends_as_a_process_does(tmp_path):
    # A program ends as a process would: its exit status, its excepthook
    # (agnostic's failure reports), its threads joined, then its exit
    # handlers (torch's launcher waits there for its workers).
    failing = tmp_path / "failing.py"
    failing.write_text(
        "import atexit, sys, threading, time\n"
        "def write(name, text):\n    open(sys.argv[2] + name, 'w').write(text)\n"
        "thread = threading.Thread(target=lambda: (time.sleep(1), write('.thread', 'x')))\n"
        "thread.start()\n"
        "atexit.register(lambda: write('.atexit', open(sys.argv[2] + '.thread').read()))\n"
        "sys.excepthook = lambda kind, value, trace: write('.hook', str(value))\n"
        "if sys.argv[1] == 'exit':\n    sys.exit(3)\n"
        "raise ValueError('the program failed here')\n")
    raised, exited = str(tmp_path / "raised"), str(tmp_path / "exited")
    assert warm.run(str(failing), ["raise", raised], {}, raised)[0] == 1
    assert open(raised + ".hook").read() == "the program failed here"
    assert open(raised + ".atexit").read() == "x"
    assert warm.run(str(failing), ["exit", exited], {}, exited)[0] == 3
    assert open(exited + ".atexit").read() == "x"


@pytest.mark.parametrize("replicas", [pytest.param("2", marks=VERSIONS), "4"])
def test_batch_normalization_uses_the_global_batch(replicas, tmp_path):
    plain, agnostic = run_both("batchnorm_cnn", tmp_path,
                               env={"AGNOSTIC_TEST_REPLICAS": replicas})
    assert_same_training(plain, agnostic)
    np.testing.assert_allclose(agnostic["predictions"], plain["predictions"], atol=1e-5)
    np.testing.assert_allclose(agnostic["by_template"], plain["predictions"], atol=1e-5)
    assert agnostic["replica_spread"] == 0.0


def test_per_replica_batch_statistics_keep_the_moving_ones_in_step(tmp_path):
    plain, agnostic = run_both("batchnorm_cnn", tmp_path,
                               env={"AGNOSTIC_TEST_SYNC_BATCH_NORM": "0"})
    if ENGINE != "jax":  # JAX's one program always sees the global batch
        assert relative_difference(plain["weights"], agnostic["weights"]) > 1e-4
    # Every replica, and the template, hold the same moving statistics.
    assert agnostic["replica_spread"] < 1e-6
    np.testing.assert_allclose(agnostic["by_template"], agnostic["predictions"], atol=1e-5)


@VERSIONS
def test_count_metrics_count_every_process_samples(tmp_path):
    plain, agnostic = run_both("count_metrics", tmp_path)
    assert plain["history"]["tp"][0] > 10  # counts, not ratios
    assert_same_training(plain, agnostic)
    for call in ("trained", "tested"):  # each process takes its part of the batch
        assert plain[call]["tp"] > 10
        for key, value in plain[call].items():
            np.testing.assert_allclose(agnostic[call][key], value, rtol=1e-3, atol=1e-3,
                                       err_msg=f"{call}: {key}")
    np.testing.assert_allclose(agnostic["predicted"], plain["predicted"], atol=1e-5)


@pytest.mark.parametrize("batch, rows", [pytest.param("32", "256", marks=VERSIONS),
                                         ("33", "256"), ("1", "41")])
def test_the_guides_custom_train_step_reports_one_device_numbers(batch, rows, tmp_path):
    # Its loss tracker, updated with each share's loss and no weight, reports
    # the global batches' mean also where the shares differ in size (33),
    # and a replica or process given no rows (1) adds nothing to the step.
    env = {"PROGRAM_BATCH": batch, "PROGRAM_ROWS": rows}
    plain, agnostic = run_both("custom_train_step", tmp_path, env=env, both=True)
    assert plain["history"]["seen"] == [float(rows)] * 2  # a Sum: every sample of an epoch
    assert_same_training(plain, agnostic)
    assert_same_history(plain, agnostic)


@pytest.mark.skipif(ENGINE != "tensorflow", reason="the step's own optimizer: the "
                    "TensorFlow variant (torch warns, see test_torch_ddp)")
def test_a_custom_step_with_an_optimizer_of_its_own(tmp_path):
    plain, agnostic = run_both("custom_train_step", tmp_path,
                               env={"PROGRAM_OWN_OPTIMIZER": "1"}, both=True)
    assert_same_training(plain, agnostic)


def test_every_process_loads_the_file_just_saved(tmp_path):
    plain, agnostic = run_both("save_then_load", tmp_path)
    assert_same_training(plain, agnostic)
    loads = sorted(name for name in os.listdir(tmp_path) if "agnostic-loaded-by" in name)
    assert len(loads) == (2 if ENGINE == "torch" else 1)
    for name in loads:
        assert float(open(tmp_path / name).read()) == 0.0, name
    # The file holds what plain Keras writes for the model, nothing twice.
    assert agnostic["entries"] == plain["entries"]
    np.testing.assert_allclose(agnostic["predictions"], plain["predictions"], atol=1e-5)


@VERSIONS
def test_several_steps_per_execution_train_like_one_device(tmp_path):
    script = os.path.join(PROGRAMS, "steps_per_execution.py")
    refused = "`steps_per_execution` must be 1 with the PyTorch backend"
    try:
        run_plain(script, tmp_path)  # kept for run_both
    except AssertionError as failure:  # Keras on torch before 3.16: the same refusal
        assert refused in str(failure)
        agnostic = run_script(script, "agnostic", tmp_path, check=False)
        assert refused in agnostic[2]
        return
    plain, agnostic = run_both("steps_per_execution", tmp_path)
    assert_same_training(plain, agnostic)


def test_a_generator_loses_no_batch(tmp_path):
    plain, agnostic = run_both("generator", tmp_path)
    assert_same_training(plain, agnostic)


@VERSIONS
def test_arrays_shuffled_with_a_seed_give_one_device_batches(tmp_path):
    plain, agnostic = run_both("shuffled_arrays", tmp_path)
    assert_same_training(plain, agnostic)


def test_a_sequential_without_an_input_is_built_from_the_first_batch(tmp_path):
    plain, agnostic = run_both("unbuilt_sequential", tmp_path)
    assert_same_training(plain, agnostic)
    np.testing.assert_allclose(agnostic["predictions"], plain["predictions"], atol=1e-5)


@pytest.mark.parametrize("shuffle", ["0", "1"])
def test_a_pydataset_trains_like_one_device(shuffle, tmp_path):
    plain, agnostic = run_both("pydataset", tmp_path, env={"PROGRAM_SHUFFLE": shuffle},
                               both=True)
    assert_same_training(plain, agnostic)


# 33 over 1,001 rows (a last batch of 11), 17 over 307 (a last batch of
# one row: a replica or process gets none) and 1 over 41. torch: processes,
# each one starting the engine (the costly case): 2.
ODD_BATCHES = [("33", "1001", "2"), ("17", "307", "2" if ENGINE == "torch" else "4"),
               ("1", "41", "2")]


@pytest.mark.parametrize("batch, rows, replicas", ODD_BATCHES)
def test_batches_of_any_size_train_like_one_device(batch, rows, replicas, tmp_path):
    # fit (arrays, validation_data, a PyDataset), evaluate, predict and the
    # *_on_batch methods on batches that do not divide by the devices, with
    # BatchNormalization: each share counts as its rows do on one device.
    env = {"PROGRAM_BATCH": batch, "PROGRAM_ROWS": rows, "AGNOSTIC_TEST_REPLICAS": replicas}
    plain, agnostic = run_both("odd_batches", tmp_path, env=env, both=True)
    assert agnostic["devices_used"] == int(replicas)
    assert_odd_batches_like_one_device(plain, agnostic)


def assert_odd_batches_like_one_device(plain, agnostic):
    """odd_batches.py's runs: every way it trains, evaluates and predicts."""
    assert_same_training(plain, agnostic)
    for fit in ("from_dataset", "from_split"):
        for key, values in plain[fit].items():
            np.testing.assert_allclose(agnostic[fit][key], values, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{fit}: {key}")
    for expected, actual in zip(plain["on_batch"], agnostic["on_batch"]):
        for key, value in expected.items():
            np.testing.assert_allclose(actual[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    for key, rows_expected in (("predictions", 7), ("on_batch_predictions", 3)):
        assert len(agnostic[key]) == rows_expected
        np.testing.assert_allclose(agnostic[key], plain[key], atol=1e-5, err_msg=key)


@pytest.mark.skipif(ENGINE != "tensorflow", reason="tf.data is TensorFlow's pipeline; "
                    "the tensorflow environment runs this program")
def test_a_seeded_tf_data_shuffle_gives_one_device_batches(tmp_path):
    plain, agnostic = run_both("tf_data_shuffle", tmp_path)
    assert_same_training(plain, agnostic)


@pytest.mark.skipif(ENGINE != "torch", reason="torch.utils.data is torch's pipeline; the "
                    "torch environment runs this program")
def test_a_torch_dataloader_gives_each_process_its_part_of_every_batch(tmp_path):
    # fit (with a validation DataLoader), evaluate and predict from torch
    # DataLoaders in batches of 33 (before: UnsupportedInputError).
    assert_two_devices_train_like_one("torch_loader", tmp_path)


def assert_two_devices_train_like_one(name, folder):
    """A program's run on 2 devices against its plain run: weights, history
    and predictions."""
    plain, agnostic = run_both(name, folder)
    assert agnostic["devices_used"] == 2
    assert_same_training(plain, agnostic)
    assert_same_history(plain, agnostic)
    np.testing.assert_allclose(agnostic["predictions"], plain["predictions"], atol=1e-5)


@pytest.mark.parametrize("name", ["resnet_block", "multi_io", "sequence_model",
                                  "mixed_precision"])
def test_ordinary_models_train_like_one_device(name, tmp_path):
    plain, agnostic = run_both(name, tmp_path)
    # float16 compute rounds differently when the batch is split.
    tolerance = 1e-3 if name == "mixed_precision" else 1e-5
    assert_same_training(plain, agnostic, weights=tolerance)


def test_bfloat16_trains_within_its_measured_tolerance(tmp_path):
    # bfloat16 keeps 8 bits of mantissa: each replica's part of the batch
    # rounds its sums otherwise than the whole batch on one device. Measured
    # on 2 devices (Keras 3.15.1): weights 1.8e-3 TensorFlow, 1.7e-3 JAX,
    # 2.7e-3 torch from one device (docs/guarantees.md).
    plain, agnostic = run_both("mixed_precision", tmp_path,
                               env={"PROGRAM_POLICY": "mixed_bfloat16"}, both=True)
    assert_same_training(plain, agnostic, weights=5e-3, logs=1e-2)


def test_callbacks_see_one_device_logs(tmp_path):
    plain, agnostic = run_both("callbacks", tmp_path)
    assert plain["epochs"] == 2  # EarlyStopping stopped, restoring epoch 1's weights
    assert agnostic["epochs"] == plain["epochs"]
    assert agnostic["learning_rate"] == pytest.approx(plain["learning_rate"])
    assert_same_training(plain, agnostic)


def test_random_layers_train_like_one_device(tmp_path):
    # RandomFlip, RandomTranslation and Dropout draw for the whole batch and
    # keep each replica's rows (compat/random_draws.py), as JAX's one program
    # does; before, each drew for its own share (9.1e-3 TensorFlow, 9.9e-3
    # torch after 2 epochs).
    plain, agnostic = run_both("augmented_cnn", tmp_path)
    assert_same_training(plain, agnostic)
    assert_same_history(plain, agnostic)


DEVICE_PARALLEL_REPLICAS = ["2", "4"] if ENGINE in ("jax", "torch") else ["2"]


@pytest.mark.parametrize("devices", DEVICE_PARALLEL_REPLICAS)
def test_device_parallelism_trains_as_one_device(devices, tmp_path):
    """The legacy example, with agnostic.device() for tf.device(): the same
    weights as the unplaced model on one device; the template gets them, and
    the saved file loads on one device. JAX and torch with 4 devices: 2
    replicas of the 2 placed devices (torch: a process each)."""
    plain, agnostic = run_both("device_parallel", tmp_path,
                               env={"AGNOSTIC_TEST_REPLICAS": devices})
    assert_same_training(plain, agnostic)
    np.testing.assert_allclose(agnostic["by_template"], plain["predictions"], atol=1e-5)
    np.testing.assert_allclose(agnostic["by_loaded"], agnostic["predictions"], atol=1e-6)
    if ENGINE == "tensorflow":
        # The shared LSTM lives where its first call ran; the branch's Dense on device 1.
        placed = agnostic["devices"]
        assert placed["lstm/lstm_cell/kernel"].endswith("CPU:0")
        assert placed["branch_b/kernel"].endswith("CPU:1")
        assert placed["branch_b/bias"].endswith("CPU:1")


# The global batch's view (agnostic/fit/global_batch.py): what looks at the whole
# batch in a step sees it on every engine, on shares of unequal size.
@pytest.mark.parametrize("replicas", ["2", "4"] if ENGINE != "torch" else ["2"])
def test_losses_over_the_whole_batch_train_like_one_device(replicas, tmp_path):
    # reduction="sum", a sample-weighted mean, a loss of the batch's mean.
    env = {"AGNOSTIC_TEST_REPLICAS": replicas}
    plain, agnostic = run_both("whole_batch_losses", tmp_path, env=env)
    assert agnostic["devices_used"] == int(replicas)
    assert_same_training(plain, agnostic)
    assert_same_history(plain, agnostic)


# JAX's steps are stateless: keras.io's dual encoder writes its own step for
# TensorFlow (and this program for torch too); JAX runs the compiled loss.
@pytest.mark.parametrize("own_step", ["0", "1"] if ENGINE != "jax" else ["0"])
def test_an_in_batch_softmax_trains_like_one_device(own_step, tmp_path):
    plain, agnostic = run_both("dual_encoder", tmp_path, env={"PROGRAM_OWN_STEP": own_step},
                               both=True)
    assert_same_training(plain, agnostic)
    assert_same_history(plain, agnostic)


def test_the_programs_own_metric_holds_one_devices_state_everywhere(tmp_path):
    plain, agnostic = run_both("own_metric", tmp_path)
    assert_same_training(plain, agnostic)
    assert plain["after_fit"][1] == 320  # every sample counted once
    processes = sorted(tmp_path.glob("agnostic-metric-*.json"))
    assert len(processes) == (2 if ENGINE == "torch" else 1)
    for held in processes:
        held = json.loads(held.read_text())
        for key in ("after_fit", "after_evaluate"):
            np.testing.assert_allclose(held[key], plain[key], rtol=1e-6, err_msg=key)


def test_a_layers_own_state_follows_its_declared_aggregation(tmp_path):
    # A sample counter declared "sum" (before: TensorFlow summed each
    # replica's `value + delta`, doubling the count each step, 33,554,400
    # for 640 samples; torch kept process 0's 320) and a running mean
    # declared "mean", updated in the layer's call.
    # The largest value seen, declared nothing, is one replica's on
    # TensorFlow and torch (each computes it from its own share): one
    # warning names it and the fix; JAX's one program sees every row.
    plain, agnostic = run_both("layer_state", tmp_path)
    assert plain["seen"] == 640
    assert agnostic["seen"] == plain["seen"]
    np.testing.assert_allclose(agnostic["running_mean"], plain["running_mean"], atol=1e-6)
    for run in (plain, agnostic):  # the peak is compared below
        run["weights"] = [w for w in run["weights"] if not np.array_equal(w, run["peak"])]
    assert_same_training(plain, agnostic)
    assert plain["warned"] == []
    if ENGINE == "jax":
        assert agnostic["warned"] == []
        np.testing.assert_allclose(agnostic["peak"], plain["peak"], atol=1e-6)
    else:
        [warned] = agnostic["warned"]
        assert "counting/peak'" in warned and "2 replicas" in warned and 'aggregation="sum"' in warned
        assert "seen" not in warned and "running_mean" not in warned


def test_two_models_sharing_an_encoder_frozen_between_them(tmp_path):
    # The first model evaluated again after the second froze the shared
    # encoder: on JAX, Keras's DataParallel failed there ("pjit
    # out_shardings ... length 0 ... length 2"), with or without agnostic.
    plain, agnostic = run_both("shared_encoder", tmp_path)
    assert_same_training(plain, agnostic)
    for key in ("before", "after"):
        assert agnostic[key] == pytest.approx(plain[key], rel=1e-5), key


def test_the_per_replica_view_is_cheaper_and_differs_measurably(tmp_path):
    # global_view=False: each replica's loss over its own share; a loss with
    # reduction="sum" then trains at 1/N of the rate (measured, not asserted
    # equal: the option's difference is documented).
    env = {"AGNOSTIC_TEST_GLOBAL_VIEW": "0"}
    plain, agnostic = run_both("whole_batch_losses", tmp_path, env=env)
    if ENGINE == "jax":  # one program: the option changes nothing
        assert_same_training(plain, agnostic)
        return
    difference = relative_difference(plain["weights"], agnostic["weights"])
    assert difference > 1e-3
    assert agnostic["history"]["summed_loss"][0] != pytest.approx(
        plain["history"]["summed_loss"][0], rel=1e-3)
