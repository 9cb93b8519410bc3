"""Device parallelism on each engine, in this process: agnostic.device()
records each layer call of a functional model, and the returned model runs
it on its device (TensorFlow, torch) or lays the placed layers out over the
placed devices (JAX). The training itself is compared with one device in
test_programs.py (the legacy example)."""
import contextlib
import warnings

import numpy as np
import pytest

from tests.conftest import engine_or_skip

keras = engine_or_skip()
ENGINE = keras.backend.backend()

import agnostic  # noqa: E402
from agnostic import errors  # noqa: E402
from agnostic.plan import placement

VERSIONS = pytest.mark.keras_versions
KERAS_3 = pytest.mark.skipif(ENGINE == "mxnet", reason="keras-mxnet has no placements")


def two_branches(place=agnostic.device):
    """Branch a on device 0, branch b on device 1, the head on the CPU."""
    keras.utils.set_random_seed(3)
    input_a, input_b = keras.Input((6,)), keras.Input((6,))
    with place(0):
        hidden_a = keras.layers.Dense(4, name="branch_a")(input_a)
    with place(1):
        hidden_b = keras.layers.Dense(4, name="branch_b")(input_b)
    with place("cpu"):
        merged = keras.layers.concatenate([hidden_a, hidden_b], name="merge")
        output = keras.layers.Dense(1, name="head")(merged)
    return keras.Model([input_a, input_b], output)


def compile_placed(model, **options):
    """In this process: on 2 devices (torch would start a process per
    replica of the placed devices on more)."""
    options.setdefault("gpus", 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = agnostic.backend_agnostic_compile(
            model, optimizer=keras.optimizers.SGD(0.05), loss="mse", **options)
    return compiled, caught


def data(samples=32):
    rng = np.random.default_rng(0)
    return [rng.random((samples, 6), dtype="float32"),
            rng.random((samples, 6), dtype="float32")], rng.random((samples, 1), dtype="float32")


@KERAS_3
@VERSIONS
def test_the_plan_lists_every_placed_call_in_the_order_the_model_runs_them():
    model = two_branches()
    plan = agnostic.resolve(model=model)
    names = dict(enumerate(plan.devices))
    assert plan.strategy == placement.DEVICE_PARALLEL[ENGINE]
    calls = [call for call, _ in plan.placements]
    assert sorted(calls[:2]) == ["branch_a:0", "branch_b:0"]
    assert calls[2:] == ["merge:0", "head:0"]
    assert dict(plan.placements)["branch_b:0"] == names[1]
    # Nothing is recorded outside agnostic.device(), nor for a model built after.
    assert agnostic.resolve(model=two_branches(lambda _: contextlib.nullcontext())).placements == ()


@KERAS_3
def test_a_sequential_model_with_placements_is_refused_naming_the_functional_api():
    with agnostic.device(1):
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    with pytest.raises(errors.NotSupportedError, match="Build it with the functional API"):
        agnostic.backend_agnostic_compile(model, optimizer="sgd", loss="mse")
    plain = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    assert agnostic.resolve(model=plain).placements == ()


@KERAS_3
def test_a_placement_on_a_missing_device_is_refused_before_anything_is_built():
    input_a = keras.Input((6,))
    with agnostic.device(7):
        output = keras.layers.Dense(1, name="far")(input_a)
    model = keras.Model(input_a, output)
    with pytest.raises(errors.DeviceRequestError, match=r"agnostic.device\(7\) places the "
                                                        r"call 'far:0' on device id 7"):
        agnostic.backend_agnostic_compile(model, optimizer="sgd", loss="mse")
    assert not model.compiled


@KERAS_3
@VERSIONS
def test_the_template_gets_the_trained_weights_and_fit_is_keras_own():
    template = two_branches()
    model, _ = compile_placed(template)
    x, y = data()
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    for ours, theirs in zip(template.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


@KERAS_3
def test_the_innermost_placement_wins_and_a_returned_model_keeps_its_placements():
    from keras.src.ops import node  # Keras's own class, checked as it is

    init = node.Node.__init__
    input_a = keras.Input((6,))
    hidden = keras.layers.Dense(4, name="before")(input_a)
    with agnostic.device(0):
        hidden = keras.layers.Dense(4, name="outer")(hidden)
        with agnostic.device(1):
            hidden = keras.layers.Dense(3, name="inner")(hidden)
            assert node.Node.__init__ is init  # nothing of Keras's is replaced
        hidden = keras.layers.Dense(2, name="outer_again")(hidden)
    output = keras.layers.Dense(1, name="after")(hidden)
    template = keras.Model(input_a, output)
    plan = agnostic.resolve(model=template)
    assert [(call, plan.devices.index(name)) for call, name in plan.placements] == [
        ("outer:0", 0), ("inner:0", 1), ("outer_again:0", 0)]
    model, _ = compile_placed(template)
    assert agnostic.resolve(model=model).placements == plan.placements


@KERAS_3
def test_compiling_the_returned_model_again_fine_tunes_it_as_plain_keras_does():
    """Train, freeze a branch, compile again, train on: the same weights as
    the same steps with plain compile on one device."""
    x, y = data()
    results = []
    for place in (agnostic.device, lambda _: contextlib.nullcontext()):
        model = two_branches(place)
        for round in range(2):
            if place is agnostic.device:
                model, _ = compile_placed(model)
            else:
                model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
            model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
            model.get_layer("branch_a").trainable = False
        results.append(model.get_weights())
    for placed, plain in zip(*results):
        np.testing.assert_allclose(np.asarray(placed), np.asarray(plain), atol=1e-6)


@pytest.mark.skipif(ENGINE != "tensorflow", reason="TensorFlow's own placement")
@VERSIONS
def test_tensorflow_places_each_call_and_each_layers_variables():
    import tensorflow as tf

    model, caught = compile_placed(two_branches(), gpus=None)
    # 4 simulated devices, 2 placed: the others are said to stay idle.
    assert [str(w.message) for w in caught if w.category is errors.PlacementWarning] == [
        "The model's agnostic.device() placements use device ids 0, 1; /device:CPU:2, "
        "/device:CPU:3 stay idle: combining device parallelism with data parallelism is "
        "not supported on tensorflow yet (on JAX and torch it is)."]
    devices = {w.path: w.value.device for w in model.weights}
    assert devices["branch_a/kernel"].endswith("CPU:0")
    assert devices["branch_b/kernel"].endswith("CPU:1")
    assert devices["branch_b/bias"].endswith("CPU:1")
    spec = tf.TensorSpec((4, 6))
    graph = tf.function(lambda a, b: model([a, b])).get_concrete_function(spec, spec).graph
    matmuls = sorted(op.device.split("device:")[-1] for op in graph.get_operations()
                     if op.type == "MatMul")
    assert matmuls == ["CPU:0", "CPU:0", "CPU:1"]  # branch a, head; branch b


@pytest.mark.skipif(ENGINE != "jax", reason="JAX's layouts")
def test_jax_lays_the_placed_layers_out_over_the_placed_devices():
    import jax

    with pytest.warns(errors.PlacementWarning, match="cannot keep a layer on one device"):
        model = agnostic.backend_agnostic_compile(two_branches(), optimizer="sgd",
                                                  loss="mse", gpus=2)
    for weight in model.weights:
        sharding = weight.value.sharding
        assert sharding.device_set == set(jax.devices()[:2])
    kernel = next(w for w in model.weights if w.path == "branch_b/kernel")
    assert tuple(kernel.value.sharding.spec) == (None, "model")  # split, not copied
    assert len(kernel.value.addressable_shards) == 2


@pytest.mark.skipif(ENGINE != "torch", reason="torch's device moves")
def test_torch_runs_each_placed_call_in_its_device_scope(monkeypatch):
    """Without a GPU every torch device is the CPU, so this checks the
    plumbing: the device scope each call runs in (a spy on keras.device,
    which still enters the real scope), not where the memory is."""
    entered = []
    real = keras.device

    def spy(name):
        entered.append(name)
        return real(name)

    model = agnostic.backend_agnostic_compile(
        two_branches(), optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse", gpus=2)
    monkeypatch.setattr(keras, "device", spy)
    x, y = data(8)
    model.predict(x, verbose=0)
    assert entered == ["cpu"] * 4  # branch a, branch b, merge, head
    entered.clear()
    model.optimizer.build(model.trainable_variables)
    assert entered == ["cpu"] * 6  # each momentum in its weight's device scope
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert agnostic.resolve(gpus=2, model=two_branches()).devices == ("cpu:0", "cpu:1")


@pytest.mark.skipif(ENGINE != "mxnet", reason="keras-mxnet only")
def test_mxnet_ignores_placements_with_a_warning():
    with pytest.warns(errors.PlacementWarning, match="ignored on MXNet"):
        with agnostic.device(1):
            pass
