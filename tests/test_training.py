"""Shared behaviour, run by every engine's tox environment: N replicas train
exactly like one device, the template holds the trained weights, fallbacks
warn, and bad requests fail before anything is built."""
import logging
import os
import warnings

import numpy as np
import pytest

from tests import models
from tests.conftest import cpu_devices, engine_or_skip, run_python

keras = engine_or_skip()

import agnostic  # noqa: E402  (after the engine check)


def sgd():
    return models.sgd(keras)


@pytest.fixture(scope="module")
def single_device_run():
    x, y = models.data()
    model = models.build(keras)
    initial = model.get_weights()
    model.compile(optimizer=sgd(), **models.COMPILE)
    history = model.fit(x, y, batch_size=models.BATCH, epochs=models.EPOCHS,
                        shuffle=False, verbose=0).history
    return initial, model.get_weights(), history


def test_the_simulated_devices_are_there():
    assert cpu_devices() >= 4, "set AGNOSTIC_CPU_DEVICES=4 for engine tests"
    plan = agnostic.resolve()
    assert plan.num_replicas == cpu_devices()
    assert plan.strategy != "single-device"


@pytest.mark.parametrize("replicas", [2, 4])
def test_replicas_train_like_one_device(single_device_run, replicas):
    initial, expected, expected_history = single_device_run
    x, y = models.data()
    template = models.build(keras, seed_value=99)  # different init, then overwritten
    template.set_weights(initial)
    model = agnostic.backend_agnostic_compile(template, optimizer=sgd(),
                                              gpus=replicas, **models.COMPILE)
    history = model.fit(x, y, batch_size=models.BATCH, epochs=models.EPOCHS,
                        shuffle=False, verbose=0).history
    assert models.relative_difference(expected, model.get_weights()) < 1e-5
    # The template holds the trained weights after fit, as with multi_gpu_model.
    assert models.relative_difference(expected, template.get_weights()) < 1e-5
    assert models.relative_difference(initial, model.get_weights()) > 1e-3
    np.testing.assert_allclose(history["loss"], expected_history["loss"], atol=1e-3)
    np.testing.assert_allclose(models.accuracy(history), models.accuracy(expected_history),
                               atol=1e-3)


def test_returned_model_evaluates_and_predicts_like_the_template(tmp_path):
    x, y = models.data()
    template = models.build(keras)
    model = agnostic.backend_agnostic_compile(template, optimizer=sgd(), gpus=2,
                                              **models.COMPILE)
    model.fit(x, y, batch_size=models.BATCH, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(model.predict(x, batch_size=32, verbose=0),
                               template.predict(x, batch_size=32, verbose=0), atol=1e-5)
    template.compile(optimizer=sgd(), **models.COMPILE)
    expected = template.evaluate(x, y, batch_size=32, verbose=0)
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=32, verbose=0),
                               expected, atol=1e-5)
    for name, saved in (("template", template), ("model", model)):
        path = models.model_file(keras, tmp_path, name)
        saved.save(path)
        loaded = keras.models.load_model(path)
        assert models.relative_difference(template.get_weights(), loaded.get_weights()) < 1e-6


def test_batch_that_cannot_be_split_fails_before_training():
    x, y = models.data(101)
    template = models.build(keras)
    before = template.get_weights()
    model = agnostic.backend_agnostic_compile(template, optimizer=sgd(), gpus=2,
                                              **models.COMPILE)
    with pytest.raises(agnostic.BatchSplitError, match="last batch of 5 samples"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    with pytest.raises(agnostic.BatchSplitError, match="not a multiple of 4"):
        agnostic.backend_agnostic_compile(models.build(keras), optimizer=sgd(), gpus=4,
                                          **models.COMPILE).fit(x[:96], y[:96], batch_size=18)
    assert models.relative_difference(before, model.get_weights()) == 0.0


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


def test_plan_is_logged_once(caplog):
    with caplog.at_level(logging.INFO, logger="agnostic"):
        agnostic.backend_agnostic_compile(models.build(keras), optimizer="sgd",
                                          gpus=2, loss="mse")
    records = [r for r in caplog.records if r.name == "agnostic"]
    assert len(records) == 1
    assert "replicas=2" in records[0].getMessage()


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
    reference.compile(optimizer=sgd(), **models.COMPILE)
    reference.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    plan = agnostic.resolve(gpus=[2])
    assert plan.strategy == "single-device"
    assert plan.devices == agnostic.resolve().devices[2:3]
    template = models.build(keras)
    model = agnostic.backend_agnostic_compile(template, optimizer=sgd(), gpus=[2],
                                              **models.COMPILE)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert models.relative_difference(reference.get_weights(), template.get_weights()) < 1e-5
    if models.is_keras3(keras):
        # Keras 2.2 on MXNet maps every cpu(i) context to cpu(0), so only
        # Keras 3 engines can show where the weights live.
        wanted = plan.devices[0].split("device:")[-1].lower()  # "cpu:2"
        for weight in model.weights:
            found = {name.split("device:")[-1].lower() for name in models.devices_of(weight)}
            assert found == {wanted}
