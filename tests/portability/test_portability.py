"""Checkpoints move across engines and device counts (Keras 3): a model
trained on 2 devices with one engine loads with plain Keras on every other
engine, one device or several, and predicts the same. Runs in the tox
environment `portability`, which has TensorFlow, JAX and torch together."""
import os

import numpy as np
import pytest

from tests.conftest import engine_or_skip, made_once, run_python, run_script

keras = engine_or_skip()
for engine in ("tensorflow", "jax", "torch"):
    pytest.importorskip(engine)

SCRIPT = os.path.join("tests", "scripts", "checkpoints.py")

LOAD = """
import json, os, sys, numpy, keras
sys.path.insert(0, os.getcwd())
from tests import models
result = {{}}
for source, folder in {folders!r}.items():
    x = numpy.load(os.path.join(folder, "x.npy"))
    whole = keras.models.load_model(os.path.join(folder, "best.keras"))
    part = models.build(keras, seed_value=123)
    part.load_weights(os.path.join(folder, "w2.weights.h5"))
    model = whole
    if {replicas} > 1:
        import agnostic
        model = agnostic.backend_agnostic_compile(whole, gpus={replicas}, loss="mse")
    result[source] = {{"whole": model.predict(x, batch_size=16, verbose=0).tolist(),
                      "part": part.predict(x, batch_size=16, verbose=0).tolist()}}
print(json.dumps(result))
"""
SOURCES = ("tensorflow", "torch")


@pytest.fixture
def trained(tmp_path):
    """{source engine: the folder of a run trained on 2 devices with it}.
    Each is trained once per session (conftest.made_once); the second test
    worker asks for them in the other order, so that both train at once."""
    order = reversed(SOURCES) if os.environ.get("PYTEST_XDIST_WORKER") == "gw1" else SOURCES
    folders = {}
    for source in order:
        folders[source] = tmp_path / source
        made_once([SCRIPT, "callbacks", source], folders[source], lambda kept, source=source:
                  run_script(SCRIPT, "callbacks", 2, kept,
                             env={"KERAS_BACKEND": source, "AGNOSTIC_CPU_DEVICES": "2"}))
    return {source: str(folders[source]) for source in SOURCES}


# Each load is one process for both source engines' checkpoints.
@pytest.mark.parametrize("target, replicas", [
    ("tensorflow", 1), ("jax", 1), ("torch", 1), ("jax", 4), ("tensorflow", 4),
])
def test_checkpoint_loads_on_every_engine_and_device_count(trained, target, replicas):
    env = {"KERAS_BACKEND": target,
           "AGNOSTIC_CPU_DEVICES": str(replicas) if replicas > 1 else None}
    result = run_python(LOAD.format(folders=trained, replicas=replicas), env=env)
    assert sorted(result) == sorted(SOURCES)
    for source, folder in trained.items():
        expected = np.load(os.path.join(folder, "predictions.npy"))
        np.testing.assert_allclose(np.array(result[source]["whole"]), expected, atol=1e-5,
                                   err_msg=f"trained with {source}")
        np.testing.assert_allclose(np.array(result[source]["part"]), expected, atol=1e-5,
                                   err_msg=f"trained with {source}")
