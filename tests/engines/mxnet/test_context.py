"""mxnet-context: keras-mxnet 2.2.4.3 on mxnet 1.9.1, cpu(i) contexts."""
import numpy as np
import pytest

from tests import models
from tests.conftest import engine_or_skip, run_python

keras = engine_or_skip()
mxnet = pytest.importorskip("mxnet")

import agnostic  # noqa: E402


def reference_run(optimizer):
    x, y = models.data()
    model = models.build(keras)
    initial = model.get_weights()
    model.compile(optimizer=optimizer, **models.COMPILE)
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    return initial, model.get_weights(), history


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("cpu_merge", [True, False])
@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_contexts_train_like_one_context(replicas, cpu_merge, optimizer):
    make = getattr(keras.optimizers, optimizer)
    initial, expected, expected_history = reference_run(make(0.01))
    x, y = models.data()
    template = models.build(keras, seed_value=5)
    template.set_weights(initial)
    model = agnostic.backend_agnostic_compile(template, optimizer=make(0.01), gpus=replicas,
                                              cpu_merge=cpu_merge, **models.COMPILE)
    assert model is template  # keras-mxnet trains the template on every context
    assert len(model._context) == replicas
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    assert models.relative_difference(expected, model.get_weights()) < 1e-5
    np.testing.assert_allclose(history["loss"], expected_history["loss"], atol=1e-3)


def test_plan_says_mxnet_is_retired_upstream():
    plan = agnostic.resolve(gpus=2)
    assert plan.strategy == "mxnet-context"
    assert plan.devices == ("cpu(0)", "cpu(1)")
    assert "MXNet is retired upstream" in plan.reason


LOAD_PLAINLY = """
import json, numpy, keras
model = keras.models.load_model({path!r})
x = numpy.load({inputs!r})
print(json.dumps(model.predict(x, batch_size=16).tolist()))
"""


def test_model_checkpoint_file_loads_in_plain_keras_mxnet(tmp_path):
    x, y = models.data()
    model = agnostic.backend_agnostic_compile(models.build(keras), optimizer=models.sgd(keras),
                                              gpus=4, **models.COMPILE)
    path = str(tmp_path / "best.h5")
    checkpoint = keras.callbacks.ModelCheckpoint(path, save_best_only=True, monitor="loss")
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[checkpoint])
    np.save(str(tmp_path / "x.npy"), x)
    # A fresh process with plain keras-mxnet: no agnostic, one context.
    loaded = run_python(LOAD_PLAINLY.format(path=path, inputs=str(tmp_path / "x.npy")),
                        env={"AGNOSTIC_CPU_DEVICES": None})
    np.testing.assert_allclose(np.array(loaded), model.predict(x, batch_size=16), atol=1e-5)
