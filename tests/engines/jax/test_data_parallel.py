"""jax-data-parallel: real keras.distribution.DataParallel on simulated CPUs."""
import pytest

from tests import models
from tests.conftest import engine_or_skip, run_python

keras = engine_or_skip()
jax = pytest.importorskip("jax")

import agnostic  # noqa: E402
from tests.test_training import FALLBACK  # noqa: E402


@pytest.mark.parametrize("replicas", [2, 4])
def test_variables_are_replicated_on_every_device(replicas):
    model = agnostic.backend_agnostic_compile(models.build(keras), optimizer="sgd",
                                              gpus=replicas, **models.COMPILE)
    assert agnostic.resolve(gpus=replicas).strategy == "jax-data-parallel"
    for weight in model.weights:
        assert len(weight.value.sharding.device_set) == replicas
        assert weight.value.sharding.is_fully_replicated


def test_models_on_different_device_counts_coexist():
    x, y = models.data()
    reference = models.build(keras)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), **models.COMPILE)
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    compiled = [
        agnostic.backend_agnostic_compile(models.build(keras),
                                          optimizer=keras.optimizers.SGD(0.1),
                                          gpus=count, **models.COMPILE)
        for count in (2, 4)
    ]
    for epoch in range(2):  # interleaved: each call runs under its own mesh
        for model in compiled:
            model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for model in compiled:
        assert models.relative_difference(reference.get_weights(), model.get_weights()) < 1e-5
    assert keras.distribution.distribution() is None  # nothing left global


def test_numpy_engine_falls_back_with_one_warning():
    # Keras's numpy engine needs jax installed, so this runs here.
    result = run_python(FALLBACK, env={"KERAS_BACKEND": "numpy"})
    assert result["strategy"] == "single-device"
    assert len(result["warnings"]) == 1
    assert "'numpy' has no multi-device path" in result["warnings"][0]


def test_cpu_relocation_warns_that_variables_stay_on_every_device():
    with pytest.warns(UserWarning, match="jax-data-parallel strategy: keras.distribution"):
        model = agnostic.backend_agnostic_compile(models.build(keras), optimizer="sgd",
                                                  gpus=2, cpu_relocation=True,
                                                  **models.COMPILE)
    assert all(len(w.value.sharding.device_set) == 2 for w in model.weights)


def test_the_template_still_predicts_after_fit_with_a_random_layer():
    """The copy's seed state once shared the template's buffer, and training
    (which donates the copy's state) deleted it: the template's predict then
    failed with "Array has been deleted"."""
    keras.utils.set_random_seed(5)
    template = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8),
                                 keras.layers.Dropout(0.5), keras.layers.Dense(1)])
    model = agnostic.backend_agnostic_compile(template, optimizer="sgd", loss="mse", gpus=2)
    x = jax.numpy.ones((16, 8))
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
    assert template.predict(x, verbose=0).shape == (16, 1)


def test_a_batch_that_does_not_divide_runs_whole_only_under_agnostics_distribution():
    # compat.jax_uneven_batches: under a distribution agnostic made, a batch
    # that does not divide over its devices is copied whole to each; one
    # that divides is split as Keras splits it; under Keras's own
    # distribution (a program without agnostic) nothing changes: JAX refuses.
    import numpy as np

    from agnostic.compat import jax_uneven_batches

    ours = keras.distribution.DataParallel(devices=jax.devices()[:2])
    in_ours = jax_uneven_batches.allow(ours)
    keras_own = keras.distribution.DataParallel(devices=jax.devices()[:2])
    module = jax_uneven_batches._module()
    keras_function = module.distribute_data_input
    for scope, distribution, rows, whole in ((in_ours, ours, 3, True), (in_ours, ours, 4, False),
                                             (keras_own.scope, keras_own, 4, False)):
        with scope():
            batch = np.zeros((rows, 2), "float32")
            laid = module.distribute_data_input(batch, distribution.get_data_layout(batch.shape),
                                                "batch")
        assert laid.sharding.is_fully_replicated is whole
        assert len(laid.sharding.device_set) == 2
    # Keras's own function outside our scope, and Keras's refusal under its own.
    assert module.distribute_data_input is keras_function
    with keras_own.scope(), pytest.raises(ValueError):
        batch = np.zeros((3, 2), "float32")
        module.distribute_data_input(batch, keras_own.get_data_layout(batch.shape), "batch")


def test_a_program_that_joins_as_keras_guide_writes_trains_in_agnostics_join(tmp_path):
    # Two processes whose program calls keras.distribution.initialize(), as
    # Keras's guide to distributed training starts; agnostic had joined them
    # to the job as JAX was imported, and JAX refuses a second join ("should
    # only be called once"). The program's call is that join; a call for
    # another job is a clear error.
    import json
    import os

    import numpy as np

    from agnostic.launch.processes import free_ports
    from tests import jobs

    script = os.path.join("tests", "scripts", "keras_guide_join.py")
    address = f"127.0.0.1:{free_ports(1)[0]}"
    processes = [jobs.start(jobs.python(script, tmp_path),
                            KERAS_DISTRIBUTION_JOB_ADDRESSES=address,
                            KERAS_DISTRIBUTION_NUM_PROCESSES="2",
                            KERAS_DISTRIBUTION_PROCESS_ID=str(index),
                            AGNOSTIC_CPU_DEVICES=None, AGNOSTIC_JOIN_SECONDS="60")
                 for index in (0, 1)]
    codes, outputs, _ = jobs.finish(processes, seconds=240)
    jobs.succeeded(codes, outputs)
    x, y = models.data()
    reference = models.build(keras)
    reference.compile(optimizer=models.sgd(keras), **models.COMPILE)
    expected = reference.fit(x, y, batch_size=models.BATCH, epochs=models.EPOCHS,
                             shuffle=False, verbose=0).history["loss"]
    for index in (0, 1):
        result = json.loads((tmp_path / f"result_{index}.json").read_text())
        assert result["processes"] == 2
        weights = models.saved_weights(tmp_path / f"weights_{index}.npz")
        assert models.relative_difference(reference.get_weights(), weights) < 1e-5
        np.testing.assert_allclose(result["loss"], expected, atol=1e-4)
        said = result["another_job"]
        assert said.startswith("LaunchError: ")
        assert f"called as process {index} of 3" in said
        assert f"as process {index} of 2 (from keras-distribution)" in said


@pytest.mark.parametrize("devices", ["names", "jax devices"])
def test_the_programs_own_data_parallel_over_the_same_devices_trains_as_before(devices):
    # Keras's guide to distribution sets a DataParallel over every device
    # before building; agnostic's is the same, so nothing is lost.
    listed = keras.distribution.list_devices() if devices == "names" else jax.devices()
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=listed))
    try:
        x, y = models.data()
        model = agnostic.backend_agnostic_compile(models.build(keras),
                                                  optimizer=keras.optimizers.SGD(0.1),
                                                  **models.COMPILE)
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    finally:
        keras.distribution.set_distribution(None)
    reference = models.build(keras)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), **models.COMPILE)
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert models.relative_difference(reference.get_weights(), model.get_weights()) < 1e-5


def test_the_programs_own_model_parallel_is_refused_not_dropped():
    # Its layouts would be replaced by agnostic's DataParallel, silently:
    # refused, naming it and both ways out, before agnostic changes anything.
    mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"],
                                         devices=keras.distribution.list_devices()[:4])
    layouts = keras.distribution.LayoutMap(mesh)
    layouts["dense(_1)?/kernel"] = (None, "model")
    users = keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")
    keras.distribution.set_distribution(users)
    try:
        template = models.build(keras)
        with pytest.raises(agnostic.errors.NotSupportedError) as refused:
            agnostic.backend_agnostic_compile(template, optimizer="sgd", **models.COMPILE)
        assert keras.distribution.distribution() is users
    finally:
        keras.distribution.set_distribution(None)
    said = str(refused.value)
    assert "keras.distribution.ModelParallel over 4 device(s)" in said
    assert "Remove the set_distribution call" in said and "model.compile" in said
    assert not template.compiled  # not compiled
    # and nothing of agnostic's left on it: a plain compile is Keras's own
    assert "compile" not in vars(template) and "_agnostic_originals" not in vars(template)
