"""Checkpoints move across engines and device counts (Keras 3): a model
trained on 2 devices with one engine loads with plain Keras on every other
engine, one device or several, and predicts the same. Runs in the tox
environment `portability`, which has TensorFlow, JAX and torch together."""
import os

import numpy as np
import pytest

from tests.conftest import engine_or_skip, run_python, run_script

keras = engine_or_skip()
for engine in ("tensorflow", "jax", "torch"):
    pytest.importorskip(engine)

SCRIPT = os.path.join("tests", "scripts", "checkpoints.py")

LOAD = """
import json, os, sys, numpy, keras
sys.path.insert(0, os.getcwd())
from tests import models
folder = {folder!r}
x = numpy.load(os.path.join(folder, "x.npy"))
whole = keras.models.load_model(os.path.join(folder, "best.keras"))
part = models.build(keras, seed_value=123)
part.load_weights(os.path.join(folder, "w2.weights.h5"))
model = whole
if {replicas} > 1:
    import agnostic
    model = agnostic.backend_agnostic_compile(whole, gpus={replicas}, loss="mse")
print(json.dumps({{"whole": model.predict(x, batch_size=16, verbose=0).tolist(),
                   "part": part.predict(x, batch_size=16, verbose=0).tolist()}}))
"""


# Two at a time (tox: -n 2 --dist loadgroup): each source engine's loads run
# on one worker, so that each trains its checkpoint once.
SOURCES = [pytest.param(engine, marks=pytest.mark.xdist_group(engine))
           for engine in ("tensorflow", "torch")]


@pytest.fixture(scope="module", params=SOURCES)
def trained(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    run_script(SCRIPT, "callbacks", 2, folder,
               env={"KERAS_BACKEND": request.param, "AGNOSTIC_CPU_DEVICES": "2"})
    return request.param, folder


@pytest.mark.parametrize("target, replicas", [
    ("tensorflow", 1), ("jax", 1), ("torch", 1), ("jax", 4), ("tensorflow", 4),
])
def test_checkpoint_loads_on_every_engine_and_device_count(trained, target, replicas):
    source, folder = trained
    env = {"KERAS_BACKEND": target,
           "AGNOSTIC_CPU_DEVICES": str(replicas) if replicas > 1 else None}
    result = run_python(LOAD.format(folder=str(folder), replicas=replicas), env=env)
    expected = np.load(folder / "predictions.npy")
    np.testing.assert_allclose(np.array(result["whole"]), expected, atol=1e-5)
    np.testing.assert_allclose(np.array(result["part"]), expected, atol=1e-5)
