"""keras.io examples, written as keras.io writes them (tests/programs/), train
through agnostic's literal swap on N devices as with plain `model.compile` on
one: weights within 1e-5 (relative to the largest), history and evaluation
within 1e-3, predictions, and the N devices really used.

Programs that draw random numbers (the GAN's latent vectors in its step,
the VAE's epsilon in a layer) run as keras.io writes them, drawing, and
with the draws given as data (PROGRAM_NOISE_AS_DATA=1: the VAE with add_loss,
TensorFlow's GAN guide): each must be one device's run on every engine."""
import importlib.util

import numpy as np
import pytest
from tests.conftest import engine_or_skip
from tests.test_programs import assert_same_history, assert_same_training, run_both

keras = engine_or_skip()

ENGINE = keras.backend.backend()
# The reduced suite each other tested Keras version runs (tox.ini).
VERSIONS = pytest.mark.keras_versions
NOISE_AS_DATA = {"PROGRAM_NOISE_AS_DATA": "1"}


def replicas_env(replicas, **extra):
    return {"AGNOSTIC_TEST_REPLICAS": replicas, **extra}


def assert_trained_on(agnostic, replicas):
    """The literal swap trained on `replicas` devices (torch: processes)."""
    assert agnostic["devices_used"] == int(replicas)
    assert all(np.isfinite(w).all() for w in agnostic["weights"])


def assert_exactly_one_device(plain, agnostic, *keys):
    """A deterministic program: one device's weights, logs to 1e-5, the
    reported arrays (`keys`), on the 2 devices the literal swap used."""
    assert_same_training(plain, agnostic)
    assert_same_history(plain, agnostic)
    for key in keys:
        assert_close(plain, agnostic, key)
    assert_trained_on(agnostic, "2")


def assert_close(plain, agnostic, key, tolerance=1e-5):
    np.testing.assert_allclose(np.asarray(agnostic[key]), np.asarray(plain[key]),
                               atol=tolerance, err_msg=key)


# torch runs 2 processes (each one starts the engine: the costly case);
# TensorFlow and JAX also 4 devices.
REPLICAS = ["2"] if ENGINE == "torch" else ["4"]
HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None


@pytest.mark.parametrize("replicas", REPLICAS)
def test_lambda_layers_and_a_layer_without_config(replicas, tmp_path):
    plain, agnostic = run_both("lambda_model", tmp_path, env=replicas_env(replicas))
    assert_same_training(plain, agnostic)
    assert_close(plain, agnostic, "predictions")
    assert_trained_on(agnostic, replicas)


@pytest.mark.skipif(not HAS_TENSORFLOW, reason="Keras's preprocessing layers adapt "
                    "and look up through TensorFlow, which this environment lacks; the "
                    "`together` environment runs this test on JAX and torch")
def test_structured_data_keeps_the_adapted_preprocessing(tmp_path):
    replicas = "2"
    plain, agnostic = run_both("structured_data", tmp_path, env=replicas_env(replicas))
    # Adapted, not the identity (the data's ages have mean 54).
    assert plain["adapted_mean"][0] == pytest.approx(54.0, abs=2.0)
    assert agnostic["adapted_mean"] == plain["adapted_mean"]
    assert agnostic["bins"] == plain["bins"]
    assert agnostic["vocabulary"] == plain["vocabulary"]
    assert_same_training(plain, agnostic)  # the loss too: preprocessing as adapted
    assert_close(plain, agnostic, "predictions")
    assert_trained_on(agnostic, replicas)


def test_lazily_built_subclassed_model_saves_and_loads(tmp_path):
    plain, agnostic = run_both("lazy_subclassed", tmp_path)
    assert_same_training(plain, agnostic)
    assert_close(plain, agnostic, "predictions")
    assert_close(plain, agnostic, "by_loaded")
    assert agnostic["loaded_class"] == "MLP"
    assert_trained_on(agnostic, "2")


@VERSIONS  # a version-gated patch acts (compat/step_logs)
def test_the_fit_guides_step_as_written_today_reports_one_device_numbers(tmp_path):
    # Its step returns {m.name: m.result() for m in self.metrics}: the loss,
    # and the compiled metrics nested in one "compile_metrics" dict, which
    # Keras takes as the step's own logs (their keys are not the metrics').
    # A share of 33 rows is 16 and 17: each process's own numbers differ,
    # in the history and after each batch (the progress bar, the callbacks).
    plain, agnostic = run_both("guide_fit_step", tmp_path)
    assert set(plain["history"]) == set(plain["evaluation"]) == {"loss", "mae"}
    assert len(plain["batches"]) == 2 * 8
    assert_exactly_one_device(plain, agnostic, "batches")
    for key, value in plain["evaluation"].items():
        np.testing.assert_allclose(agnostic["evaluation"][key], value, rtol=1e-5, err_msg=key)


def test_transformer_text_classification(tmp_path):
    plain, agnostic = run_both("transformer_text", tmp_path)
    assert_same_training(plain, agnostic)
    assert_close(plain, agnostic, "predictions")
    assert_trained_on(agnostic, "2")


def test_transfer_learning_then_fine_tuning_compiled_again(tmp_path):
    plain, agnostic = run_both("transfer_learning", tmp_path)
    assert agnostic["trainable"] == plain["trainable"]
    for expected, actual in zip(plain["frozen_base"], agnostic["frozen_base"]):
        np.testing.assert_allclose(actual, expected, atol=1e-5)  # after the frozen phase
    # The second compile trains the unfrozen base: its first kernel moved on.
    for run in (plain, agnostic):
        kernel = np.asarray(run["frozen_base"][0])
        assert np.abs(run["weights"][0] - kernel).max() > 1e-4, "the base did not train"
    assert_same_training(plain, agnostic)
    for key, values in plain["fine_tuning"].items():
        np.testing.assert_allclose(agnostic["fine_tuning"][key], values, rtol=1e-3,
                                   atol=1e-3, err_msg=key)
    assert_close(plain, agnostic, "predictions")
    assert_trained_on(agnostic, "2")


def test_gan_drawing_its_noise_in_the_step(tmp_path):
    # The step sees the global batch (agnostic/fit/global_batch.py): its draws are
    # one device's on every engine (before, each TensorFlow replica or torch
    # process drew its own share's: 7.3e-3 and 9.4e-3 after 2 epochs), so the
    # run is one device's, to the images it generates after fit. (The noise
    # given as data instead, a dict batch: below, on TensorFlow.)
    plain, agnostic = run_both("gan", tmp_path)
    assert_exactly_one_device(plain, agnostic, "images")


@pytest.mark.skipif(ENGINE != "tensorflow", reason="JAX's and torch's plain fit need "
                    "`self.built = True` (the torch guide sets it)")
def test_gan_as_the_tensorflow_guide_writes_it_without_built(tmp_path):
    """TensorFlow's guide leaves `self.built = True` out: plain fit trains
    the GAN (it has no call()), so agnostic's must too."""
    plain, agnostic = run_both("gan", tmp_path, env={"PROGRAM_UNBUILT": "1", **NOISE_AS_DATA},
                               both=True)
    assert_same_training(plain, agnostic)
    assert_trained_on(agnostic, "2")


def test_vae_drawing_epsilon_in_its_sampling_layer(tmp_path):
    # keras.io's Sampling layer draws for its rows in its call: for all the
    # rows, each replica keeping its own (before: 3.0e-2 TensorFlow, 2.6e-2
    # torch after 2 epochs), so the run is one device's, to its encodings and
    # reconstructions. (epsilon given as data, a dict batch: below.)
    plain, agnostic = run_both("vae", tmp_path)
    assert_exactly_one_device(plain, agnostic, "z_mean", "reconstruction")


def test_vae_with_add_loss_in_a_layer_and_a_compiled_loss(tmp_path):
    env = {"PROGRAM_ADD_LOSS": "1", **NOISE_AS_DATA}
    plain, agnostic = run_both("vae", tmp_path, env=env, both=True)
    assert_exactly_one_device(plain, agnostic, "z_mean")


# On JAX and torch, keras-hub's model trains in the `together` environment
# sharded (below), over the devices' shares of the batch as this run does.
@pytest.mark.skipif(not HAS_TENSORFLOW, reason="keras-hub's fit reads arrays through "
                    "tf.data (or grain), and this environment has neither; the "
                    "`together` environment trains keras-hub's model sharded on JAX "
                    "and torch")
def test_a_keras_hub_task_model_built_from_its_config(tmp_path):
    plain, agnostic = run_both("keras_hub_model", tmp_path)
    assert_same_training(plain, agnostic)
    assert_close(plain, agnostic, "predictions")
    assert_trained_on(agnostic, "2")


@pytest.mark.skipif(not HAS_TENSORFLOW or ENGINE not in ("jax", "torch"),
                    reason="shard=True splits on JAX and torch; keras-hub's fit reads "
                    "arrays through tf.data: the `together` environment runs this test")
def test_a_keras_hub_task_model_trains_sharded_like_one_device(tmp_path):
    """A wider BERT classifier from its config, shard=True on 4 devices (JAX)
    or 2 processes (torch): each holds its share of the weights and of the
    optimizer state (torch: between steps, measured after each)."""
    replicas = 4 if ENGINE == "jax" else 2
    plain, sharded = run_both("keras_hub_model", tmp_path, env={
        "PROGRAM_SIZE": "large", "AGNOSTIC_TEST_SHARD": "1",
        "AGNOSTIC_TEST_REPLICAS": str(replicas)}, both=True)
    assert_same_training(plain, sharded)
    assert_close(plain, sharded, "predictions")
    whole = {part: sum(sizes[part] for sizes in plain["bytes_per_device"].values())
             for part in ("weights", "optimizer")}
    held = list(sharded["bytes_per_device"].values())
    for part in ("weights", "optimizer"):
        assert max(sizes[part] for sizes in held) <= whole[part] / replicas * 1.10, \
            (part, held, whole)


def test_the_internals_of_training_in_place_name_the_keras_version_when_they_move():
    # agnostic makes a model's engine variables again in the plan's scope
    # through Keras internals (agnostic/compat/keras_variables.py); a Keras
    # without them fails by name, before any work.
    import types

    from agnostic.compat import keras_variables

    moved = f"Keras {keras.__version__} no longer has"
    with pytest.raises(RuntimeError, match=moved):
        keras_variables.made_again(types.SimpleNamespace(value=np.zeros(())))
    with pytest.raises(RuntimeError, match=moved):
        keras_variables.train_under(types.SimpleNamespace(), strategy=None)
    with pytest.raises(RuntimeError, match=moved):
        keras_variables.optimizer_under(types.SimpleNamespace(), strategy=None)
    # On this Keras they are there.
    variable = keras.Variable(np.ones((2,), "float32"))
    assert callable(variable._initialize)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    if ENGINE == "tensorflow":
        assert "_distribute_strategy" in vars(model)
    if ENGINE == "jax":
        assert "_layout" in vars(variable)


# Each clipping on TensorFlow, whose replicas' gradients agnostic adds up and
# clips itself (engines/tensorflow/gradients.py). torch's processes average
# theirs before the optimizer sees them, and JAX's one program computes the
# whole batch's: Keras clips the one gradient there, whichever clipping, so
# one, with accumulation and without, is enough.
CLIPPING = ([pytest.param("global_clipnorm", "2", "1", marks=VERSIONS),
             ("clipvalue", "2", "1")] if ENGINE == "tensorflow" else []) + [
    ("clipnorm", REPLICAS[0], "1"),
    ("clipnorm", "2", "0"),
]


@pytest.mark.parametrize("clip, replicas, accumulate", CLIPPING)
def test_one_devices_gradient_arithmetic(clip, replicas, accumulate, tmp_path):
    # Clipping on the global batch's gradient, accumulation over 2 steps, a
    # moving average of the weights, AdamW on sparse gradients (one lookup
    # shared by the batch), a compute_loss override adding a term, add_loss
    # and a regularizer: one device's numbers, in batches of 33 over 1,001
    # rows (and 101 validation rows), which no number of devices divides.
    # Without accumulation (which makes them dense) the sparse gradients
    # reach clipping and AdamW's second moment as they are.
    env = replicas_env(replicas, PROGRAM_CLIP=clip, PROGRAM_ACCUMULATE=accumulate)
    plain, agnostic = run_both("gradient_arithmetic", tmp_path, env=env, both=True)
    assert_same_training(plain, agnostic)
    assert_same_history(plain, agnostic)
    assert_close(plain, agnostic, "predictions")
    assert len(agnostic["predictions"]) == 7
    assert agnostic["iterations"] == plain["iterations"]
    assert_trained_on(agnostic, replicas)


# On 2 devices on every engine (JAX on 4: 4.4e-3 from one device, as with
# Keras's own DataParallel without agnostic, docs/guarantees.md); 4 devices
# train tests/programs/batchnorm_cnn.py (tests/test_programs.py).
def test_digits_convnet_with_batch_normalization(tmp_path):
    # The whole digits (1,497 training rows: the epoch ends on a batch of
    # 25, shares of 13 and 12). torch: 613 training rows (the last batch 5,
    # shares of 3 and 2). Over the whole digits a MaxPooling window's choice
    # can flip on a rounding difference of a process's half batch, on some
    # CPUs (5.6e-3 on an AMD EPYC; 1.2e-7 with AveragePooling2D instead:
    # docs/guarantees.md).
    # JAX: compiled with XLA's default optimizations, where that was measured
    # (the jax environment compiles without LLVM's: tox.ini), in fresh
    # processes. TensorFlow compiles nothing with XLA on CPU, and torch none:
    # their runs come from the warm interpreter (tests/warm.py).
    env = replicas_env("2", **({"XLA_FLAGS": ""} if ENGINE == "jax" else {}),
                       **({"PROGRAM_ROWS": "913"} if ENGINE == "torch" else {}))
    plain, agnostic = run_both("digits_cnn", tmp_path, env=env, both=True)
    assert_same_training(plain, agnostic)
    assert_same_history(plain, agnostic, tolerance=1e-4)
    assert_close(plain, agnostic, "predictions")
    assert_trained_on(agnostic, "2")


def test_a_pydataset_as_keras_io_writes_it_with_fits_shuffling(tmp_path):
    plain, agnostic = run_both("keras_io_pydataset", tmp_path, env=replicas_env("2"))
    assert_same_training(plain, agnostic)
    assert_close(plain, agnostic, "predictions")
    assert_close(plain, agnostic, "loaded")
    assert_trained_on(agnostic, "2")
