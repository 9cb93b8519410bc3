"""Shared behaviour, run by every engine's tox environment: N replicas train
exactly like one device, the template holds the trained weights, fallbacks
warn, and bad requests fail before anything is built.

Training on several devices runs tests/scripts/scenario.py as a user runs a
script, so that strategies that start processes do so for real."""
import os

import numpy as np
import pytest

from tests import models
from tests.conftest import cpu_devices, engine_or_skip, run_python, run_script

keras = engine_or_skip()

import agnostic  # noqa: E402  (after the engine check)

SCENARIO = os.path.join("tests", "scripts", "scenario.py")


def test_the_simulated_devices_are_there():
    assert cpu_devices() >= 4, "set AGNOSTIC_CPU_DEVICES=4 for engine tests"
    plan = agnostic.resolve()
    assert plan.num_replicas == cpu_devices()
    assert plan.strategy != "single-device"


@pytest.mark.parametrize("replicas, scenario", [(1, "finetune"), (2, "finetune"),
                                               (2, "finetune_plain")])
def test_compiling_again_after_freezing_a_layer(replicas, scenario, tmp_path):
    # Fine-tuning: the returned model trains, a layer is frozen, the model is
    # compiled again and trains on. Wrappers from the first compile must not
    # stack on the second (a batch sharded twice, gradients averaged twice).
    # finetune_plain: the second compile is the program's plain
    # model.compile, which compiles through agnostic again (a second plan).
    result, _, _ = run_script(SCENARIO, scenario, replicas, tmp_path)
    assert result["frozen_moved"] == 0
    assert result["model_vs_reference"] < 1e-5
    np.testing.assert_allclose(*result["loss"], atol=1e-3)
    assert len(result["plans"]) == 2, result["plans"]
    assert all(f"replicas={replicas}" in line for line in result["plans"])


# On 4 (torch: 4 processes); 2 devices train most programs of
# tests/test_programs.py and tests/test_keras_io.py, and keras-mxnet's
# context list both.
@pytest.mark.parametrize("replicas", [2, 4] if keras.backend.backend() == "mxnet" else [4])
def test_replicas_train_like_one_device(replicas, tmp_path):
    result, _, stderr = run_script(SCENARIO, "equivalence", replicas, tmp_path)
    assert result["num_replicas"] == replicas
    assert result["strategy"] == agnostic.resolve(gpus=replicas).strategy
    assert result["model_vs_reference"] < 1e-5
    # The template holds the trained weights after fit, as with multi_gpu_model.
    assert result["template_vs_reference"] < 1e-5
    assert result["moved"] > 1e-3
    np.testing.assert_allclose(*result["loss"], atol=1e-3)
    np.testing.assert_allclose(*result["accuracy"], atol=1e-3)
    np.testing.assert_allclose(*result["evaluate"], atol=1e-5)
    assert result["predict"] < 1e-5
    assert result["loaded"]["template"] < 1e-6 and result["loaded"]["model"] < 1e-6
    # The plan is logged once, by one process.
    plans = [line for line in result["logs"] if line.startswith("plan:")]
    assert len(plans) == 1 and f"replicas={replicas}" in plans[0], result["logs"]
    assert stderr.count("plan: backend=") <= 1
    assert "agnostic plan" not in stderr  # one prefix: the logger's name, if shown


# Engines whose strategy weights each replica's share by its size: any
# batch size trains as on one device there. The others refuse, before work.
UNEVEN_SHARES = ("tensorflow", "jax", "torch")


# tests/programs/odd_batches.py runs every method on 2 and 4 devices; this
# scenario, the refusals too (keras-mxnet).
@pytest.mark.parametrize("replicas", [2, 4] if keras.backend.backend() == "mxnet" else [2])
def test_batches_that_do_not_divide_train_like_one_device(replicas, tmp_path):
    result, _, _ = run_script(SCENARIO, "split", replicas, tmp_path)
    if keras.backend.backend() in UNEVEN_SHARES:
        assert result["errors"] == []
        assert result["vs_reference"] < 1e-5
        assert result["unchanged"] > 1e-3
        assert result["predict"] < 1e-6
        return
    first, second = result["errors"][:2]
    assert "101 samples with batch_size=16 leave a last batch of 5 samples" in first
    assert f"cannot be split evenly over {replicas} replicas" in first
    assert f"batch_size={8 * replicas + 1} is the global batch, split over {replicas} replicas in equal parts" in second
    assert result["unchanged"] == 0.0


@pytest.mark.parametrize("gpus, message", [
    (9, r"gpus=9 asks for 9 devices, but only 4 exist: 0: .*3: "),
    ([0, 5], r"names device id 5, which does not exist\. The devices are 0: "),
    ([1, 1], r"names device 1 more than once"),
    (0, r"must be at least 1"),
    ("all", r"Received: gpus='all' \(of type str\)"),
])
def test_bad_gpus_fail_before_anything_is_built(gpus, message):
    template = models.build(keras)
    with pytest.raises(agnostic.DeviceRequestError, match=message):
        agnostic.backend_agnostic_compile(template, optimizer="sgd", gpus=gpus, loss="mse")
    assert not getattr(template, "compiled", False)  # nothing was compiled


def test_bad_arguments_fail_before_anything_is_built():
    with pytest.raises(TypeError, match=r"expects a Keras model .* Received: model='model'"):
        agnostic.backend_agnostic_compile("model", loss="mse")
    # The class, not a model (before: "'mappingproxy' object has no attribute 'pop'").
    with pytest.raises(TypeError, match=r"a Keras model object, not a class. Received: "
                       r"model=keras\S*\.Model \(the class itself\). Make the model first"):
        agnostic.backend_agnostic_compile(keras.Model, loss="mse")
    template = models.build(keras)
    with pytest.raises(TypeError, match=r"`cpu_merge` must be True or False"):
        agnostic.backend_agnostic_compile(template, loss="mse", cpu_merge="yes")
    assert not getattr(template, "compiled", False)


@pytest.mark.parametrize("keyword, meant", [
    ("gpu", "gpus"), ("sync_batchnorm", "sync_batch_norm"), ("metric", "metrics"),
    ("cpu_merging", "cpu_merge"), ("lossweights", "loss_weights")])
def test_a_mistyped_keyword_names_the_one_meant(keyword, meant):
    template = models.build(keras)
    with pytest.raises(TypeError) as raised:
        agnostic.backend_agnostic_compile(template, optimizer="sgd", loss="mse",
                                          **{keyword: 2})
    assert (f"backend_agnostic_compile got an unexpected keyword argument {keyword!r}. "
            f"Did you mean {meant}=...?") in str(raised.value)
    assert f"Received: {keyword}=2" in str(raised.value)
    assert not getattr(template, "compiled", False)


def test_a_models_own_compile_keywords_are_the_ones_checked():
    # A GAN's compile takes keywords Keras's does not: its own are the ones named.
    class GAN(keras.Model):
        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.loss_fn = loss_fn

    gan = GAN()
    with pytest.raises(TypeError, match=r"Did you mean loss_fn=\.\.\.\?"):
        agnostic.backend_agnostic_compile(gan, d_optimizer="adam", g_optimizer="adam",
                                          loss_function="mse")


FALLBACK = """
import json, warnings, keras, agnostic
inputs = keras.layers.Input((3,))
model = keras.models.Model(inputs, keras.layers.Dense(1)(inputs))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    compiled = agnostic.backend_agnostic_compile(model, loss="mse", optimizer="sgd")
ours = [w for w in caught if issubclass(w.category, agnostic.SingleDeviceWarning)]
print(json.dumps({"strategy": agnostic.resolve().strategy, "same": compiled is model,
                  "warnings": [str(w.message) for w in ours]}))
"""


def test_one_device_falls_back_with_one_warning():
    result = run_python(FALLBACK, env={"AGNOSTIC_CPU_DEVICES": None})
    assert result["strategy"] == "single-device"
    assert result["same"] is True
    assert len(result["warnings"]) == 1
    assert "AGNOSTIC_CPU_DEVICES=N" in result["warnings"][0]


def test_cpu_relocation_where_it_cannot_apply_warns_once():
    template = models.build(keras)
    with pytest.warns(UserWarning, match="cpu_relocation=True changes nothing") as caught:
        agnostic.backend_agnostic_compile(template, optimizer=models.sgd(keras), gpus=[1],
                                          cpu_relocation=True, **models.COMPILE)
    assert len([w for w in caught if "cpu_relocation" in str(w.message)]) == 1


CPU_SPLIT_AFTER_ENGINE = """
import json, os, sys
import {engine}  # the engine first, then a model, then agnostic
import keras
inputs = keras.layers.Input((3,))
model = keras.models.Model(inputs, keras.layers.Dense(1)(inputs))
model.predict(__import__("numpy").zeros((2, 3)), verbose=0)
import agnostic
print(json.dumps({{"replicas": agnostic.resolve().num_replicas}}))
"""


def test_cpu_devices_apply_whatever_the_script_imports_first():
    engine = os.environ.get("KERAS_BACKEND")
    result = run_python(CPU_SPLIT_AFTER_ENGINE.format(engine=engine),
                        env={"AGNOSTIC_CPU_DEVICES": "3"})
    assert result["replicas"] == 3


def test_one_chosen_device_that_is_not_the_first_is_used():
    x, y = models.data()
    reference = models.build(keras)
    reference.compile(optimizer=models.sgd(keras), **models.COMPILE)
    reference.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    plan = agnostic.resolve(gpus=[2])
    # Not the engine's default device: torch's device scope, or the engine's
    # own strategy over that one device, places the model; the plan says which.
    engine = os.environ.get("KERAS_BACKEND")
    assert plan.strategy == {"torch": "single-device", "tensorflow": "tf-mirrored",
                             "jax": "jax-data-parallel", "mxnet": "mxnet-context"}[engine]
    assert plan.num_replicas == 1
    assert plan.devices == agnostic.resolve().devices[2:3]
    template = models.build(keras)
    model = agnostic.backend_agnostic_compile(template, optimizer=models.sgd(keras),
                                              gpus=[2], **models.COMPILE)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert models.relative_difference(reference.get_weights(), template.get_weights()) < 1e-5
    if os.environ.get("KERAS_BACKEND") in ("tensorflow", "jax"):
        # Keras 2.2 on MXNet maps every cpu(i) context to cpu(0), and torch
        # has one CPU device: only TensorFlow and JAX show where weights live.
        wanted = plan.devices[0].split("device:")[-1].lower()  # "cpu:2"
        for weight in model.weights:
            found = {name.split("device:")[-1].lower() for name in models.devices_of(weight)}
            assert found == {wanted}


@pytest.mark.skipif(os.environ.get("KERAS_BACKEND") in ("torch", "mxnet"),
                    reason="torch-ddp starts its processes from a script (see "
                           "tests/programs/lazy_subclassed.py); keras-mxnet builds from Input")
def test_an_unbuilt_model_fed_from_a_generator_trains_like_one_device():
    # Keras builds it from the first batch, in the strategy's scope: the
    # program's own model, with the initial weights one device draws.
    x, y = models.data()

    def batches():
        for start in range(0, len(x), 16):
            yield x[start:start + 16], y[start:start + 16]

    def trained(compile):
        models.seed(keras, 1)
        model = keras.Sequential([keras.layers.Dense(3, activation="softmax")])
        compile(model, optimizer=models.sgd(keras), **models.COMPILE)
        model.fit(batches(), epochs=1, verbose=0)
        return model

    reference = trained(lambda model, **kwargs: model.compile(**kwargs))
    model = trained(lambda model, **kwargs: agnostic.backend_agnostic_compile(
        model, gpus=2, **kwargs))
    assert len(models.devices_of(model.weights[0])) == 2
    assert models.relative_difference(reference.get_weights(), model.get_weights()) < 1e-5
