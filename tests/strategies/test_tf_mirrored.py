"""tf-mirrored: real MirroredStrategy on simulated CPU devices."""
import numpy as np
import pytest

from tests import models
from tests.conftest import engine_or_skip

keras = engine_or_skip()
tf = pytest.importorskip("tensorflow")

import agnostic  # noqa: E402


def compile_on(replicas, **options):
    template = models.build(keras)
    model = agnostic.backend_agnostic_compile(
        template, optimizer=keras.optimizers.SGD(0.1), gpus=replicas,
        **models.COMPILE, **options)
    return template, model


@pytest.mark.parametrize("replicas", [2, 4])
def test_variables_are_mirrored_on_every_device(replicas):
    _, model = compile_on(replicas)
    assert agnostic.resolve(gpus=replicas).strategy == "tf-mirrored"
    for weight in model.weights:
        assert isinstance(weight.value, tf.distribute.DistributedValues)
        assert len(weight.value.values) == replicas
    assert model.distribute_strategy.num_replicas_in_sync == replicas


def test_cpu_merge_reduces_on_the_cpu_and_false_lets_the_engine_choose():
    _, merged = compile_on(2)
    ops = merged.distribute_strategy.extended._cross_device_ops  # no public getter
    assert isinstance(ops, tf.distribute.ReductionToOneDevice)
    _, fastest = compile_on(2, cpu_merge=False)
    assert fastest.distribute_strategy.num_replicas_in_sync == 2


@pytest.mark.parametrize("options", [{"cpu_merge": False}, {"cpu_relocation": True}])
def test_options_train_like_one_device(options):
    x, y = models.data()
    reference = models.build(keras)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), **models.COMPILE)
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    template, model = compile_on(2, **options)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert models.relative_difference(reference.get_weights(), template.get_weights()) < 1e-5


def test_optimizer_object_is_rebuilt_inside_the_strategy():
    optimizer = keras.optimizers.SGD(0.1)
    template = models.build(keras)
    model = agnostic.backend_agnostic_compile(template, optimizer=optimizer, gpus=2,
                                              loss="mse")
    assert model.optimizer is not optimizer
    assert float(np.asarray(model.optimizer.learning_rate)) == pytest.approx(0.1)
