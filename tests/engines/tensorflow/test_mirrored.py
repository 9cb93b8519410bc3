"""tf-mirrored: real MirroredStrategy on simulated CPU devices."""
import warnings

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


# The engine's own all-reduce and the variables on the CPU
# (tf-central-storage), each on 2 replicas (the defaults train on 4 in
# tests/test_training.py, on 2 and 4 in tests/test_programs.py; the engine's
# all-reduce on 4 took 90 s of a loaded 2-core machine, for a count that
# tf.distribute, not agnostic, treats apart).
@pytest.mark.parametrize("options, replicas", [({"cpu_merge": False}, 2),
                                               ({"cpu_relocation": True}, 2)])
def test_options_train_like_one_device(options, replicas):
    x, y = models.data()
    reference = models.build(keras)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), **models.COMPILE)
    expected = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                             validation_split=0.25).history
    template, model = compile_on(replicas, **options)
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                        validation_split=0.25).history
    assert models.relative_difference(reference.get_weights(), template.get_weights()) < 1e-5
    assert sorted(history) == sorted(expected)
    for name in expected:  # the whole global batch, once per step
        np.testing.assert_allclose(history[name], expected[name], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=16, verbose=0),
                               reference.evaluate(x, y, batch_size=16, verbose=0), rtol=1e-4)
    np.testing.assert_allclose(model.test_on_batch(x[:16], y[:16]),
                               reference.test_on_batch(x[:16], y[:16]), rtol=1e-4)


def test_a_program_that_compiles_in_its_own_mirrored_strategy_trains_in_it():
    # Written as TensorFlow's distributed-training guide writes it: the
    # strategy's scope around building and compiling; only compile changed.
    x, y = models.data()
    reference = models.build(keras)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), **models.COMPILE)
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    users = tf.distribute.MirroredStrategy(devices=list(agnostic.resolve(gpus=2).devices))
    with users.scope():
        template = models.build(keras)
        model = agnostic.backend_agnostic_compile(
            template, optimizer=keras.optimizers.SGD(0.1), gpus=2, **models.COMPILE)
    assert model.distribute_strategy is users  # not a second strategy beside it
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert models.relative_difference(reference.get_weights(), template.get_weights()) < 1e-5


@pytest.mark.parametrize("options", [{}, {"cpu_relocation": True}])
def test_a_strategy_scope_unlike_the_plan_is_refused_before_building(options):
    one = tf.distribute.MirroredStrategy(devices=[agnostic.resolve(gpus=2).devices[0]])
    with one.scope():
        template = models.build(keras)
        with pytest.raises(agnostic.NotSupportedError) as caught:
            agnostic.backend_agnostic_compile(template, optimizer="sgd", gpus=2,
                                              **models.COMPILE, **options)
    message = str(caught.value)
    assert "inside the scope of a MirroredStrategy over 1 replica(s)" in message
    named = "tf-central-storage" if options else "tf-mirrored"  # the plan's name
    assert named in message and "over 2 replicas" in message
    assert "Call it outside any strategy scope" in message
    assert ("cpu_relocation=True" in message) == bool(options)
    assert not template.compiled  # nothing was compiled


def test_engine_all_reduce_serves_models_of_different_sizes_in_one_process():
    # The engine's all-reduce numbers device groups per strategy; a second
    # strategy of another size must not reuse the first one's groups.
    x, y = models.data()
    for replicas in (2, 4, 2):
        template, model = compile_on(replicas, cpu_merge=False)
        history = model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0).history
        assert np.isfinite(history["loss"][0])


def test_cpu_relocation_keeps_one_copy_of_each_variable_on_the_cpu():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # it applies here: no warning
        _, model = compile_on(2, cpu_relocation=True)
    for weight in model.weights:
        assert not isinstance(weight.value, tf.distribute.DistributedValues)
        assert tf.DeviceSpec.from_string(weight.value.device).device_type == "CPU"
        assert tf.DeviceSpec.from_string(weight.value.device).device_index == 0
    strategy = model.distribute_strategy
    assert isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy)
    assert strategy.num_replicas_in_sync == 2


def test_cpu_relocation_trains_layers_that_update_state_in_their_call(tmp_path):
    # Batch normalization statistics and dropout seeds are updated from every
    # device; with the variables stored once, the engine needs to be told how.
    x, y = models.data()
    keras.utils.set_random_seed(3)
    inputs = keras.layers.Input((8,))
    hidden = keras.layers.BatchNormalization()(keras.layers.Dense(16, activation="relu")(inputs))
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.Dropout(0.2)(hidden))
    template = keras.Model(inputs, outputs)
    before = template.get_weights()
    model = agnostic.backend_agnostic_compile(
        template, optimizer=keras.optimizers.SGD(0.1), gpus=2, cpu_relocation=True,
        **models.COMPILE)
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0).history
    assert np.all(np.isfinite(history["loss"]))
    moving_mean = template.get_weights()[4]  # dense kernel, bias, gamma, beta, mean
    assert not np.allclose(moving_mean, before[4])
    path = str(tmp_path / "relocated.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_allclose(restored.predict(x, verbose=0), model.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options", [{"cpu_relocation": True}, {}])
def test_metrics_that_assign_their_totals_count_like_one_device(options):
    # TruePositives, Precision, AUC... add by `assign(total + count)`, not
    # by assign_add: with the variables stored once (cpu_relocation) every
    # device's assignment would add the old total again.
    x, classes = models.data()
    y = (classes == 0).astype("float32")

    def compiled(compile_function):
        keras.utils.set_random_seed(4)
        inputs = keras.layers.Input((x.shape[1],))
        model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(inputs))
        metrics = [keras.metrics.TruePositives(name="tp"), keras.metrics.Precision(name="p"),
                   keras.metrics.AUC(name="auc"), keras.metrics.FalseNegatives(name="fn")]
        return compile_function(model, optimizer=keras.optimizers.SGD(0.1),
                                loss="binary_crossentropy", metrics=metrics)

    def plain(model, **kwargs):
        model.compile(**kwargs)
        return model

    reference = compiled(plain)
    model = compiled(lambda m, **kw: agnostic.backend_agnostic_compile(m, gpus=2, **options,
                                                                       **kw))
    run = dict(batch_size=16, epochs=2, shuffle=False, verbose=0)
    expected, history = reference.fit(x, y, **run).history, model.fit(x, y, **run).history
    for name in ("tp", "p", "auc", "fn"):
        np.testing.assert_allclose(history[name], expected[name], rtol=1e-4, err_msg=name)
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=16, verbose=0),
                               reference.evaluate(x, y, batch_size=16, verbose=0), rtol=1e-4)


@pytest.mark.parametrize("options", [{}, {"cpu_relocation": True}])
def test_on_batch_calls_split_their_batch_like_fit(options):
    # Keras hands *_on_batch's batch whole to every replica: predictions came
    # back once per replica and count metrics' state once per replica.
    x, classes = models.data()
    x, y = x[:16], (classes[:16] == 0).astype("float32")

    def compiled(compile_function):
        keras.utils.set_random_seed(6)
        inputs = keras.layers.Input((x.shape[1],))
        model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(inputs))
        return compile_function(model, optimizer=keras.optimizers.SGD(0.1),
                                loss="binary_crossentropy",
                                metrics=[keras.metrics.TruePositives(name="tp"), "accuracy"])

    def plain(model, **kwargs):
        model.compile(**kwargs)
        return model

    reference = compiled(plain)
    model = compiled(lambda m, **kw: agnostic.backend_agnostic_compile(m, gpus=4, **options,
                                                                       **kw))
    for run in (lambda m: m.train_on_batch(x, y, return_dict=True),
                lambda m: m.test_on_batch(x, y, return_dict=True),
                lambda m: m.train_on_batch(x, y, sample_weight=np.ones(16), return_dict=True)):
        expected, logs = run(reference), run(model)
        assert expected.keys() == logs.keys()
        for name in expected:
            np.testing.assert_allclose(logs[name], expected[name], rtol=1e-5, err_msg=name)
        # The state behind the logs (summed over the replicas when read):
        # every sample counted once.
        np.testing.assert_allclose(float(model.get_metrics_result()["tp"]),
                                   float(reference.get_metrics_result()["tp"]))
    predictions = model.predict_on_batch(x)
    assert np.asarray(predictions).shape == (16, 1)
    np.testing.assert_allclose(predictions, reference.predict_on_batch(x), atol=1e-6)
    assert models.relative_difference(reference.get_weights(), model.get_weights()) < 1e-6


def test_the_programs_optimizer_and_metrics_are_the_ones_that_train_mirrored():
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    metric = keras.metrics.SparseCategoricalAccuracy(name="acc")
    model = models.build(keras)
    returned = agnostic.backend_agnostic_compile(model, optimizer=optimizer, gpus=2,
                                                 loss="sparse_categorical_crossentropy",
                                                 metrics=[metric])
    assert returned is model and model.optimizer is optimizer
    x, y = models.data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert int(optimizer.iterations.numpy()) == len(x) // 16
    # Made in the strategy: one copy per replica of every variable it holds.
    for variable in optimizer.variables + metric.variables + model.weights:
        assert len(variable.value.values) == 2, variable.path
    assert float(np.asarray(optimizer.learning_rate)) == pytest.approx(0.1)


def test_central_metrics_name_the_keras_version_when_their_handle_moves():
    # tf-central-storage adds to metric totals through the engine variable a
    # Keras variable holds (`.value`); a Keras without it fails by name.
    import types

    from agnostic.compat import tf_central_metrics

    metric = keras.metrics.TruePositives()
    assert isinstance(metric.variables[0].value, tf.Variable)
    stand_in = types.SimpleNamespace(value=np.zeros(()))
    with pytest.raises(RuntimeError, match=f"Keras {keras.__version__} no longer has"):
        tf_central_metrics._stored(stand_in)


def test_batch_normalization_in_a_nested_model_uses_the_global_batch():
    def build():
        models.seed(keras, 3)
        inner = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8),
                                  keras.layers.BatchNormalization()])
        inputs = keras.Input((8,))
        outputs = keras.layers.Dense(3, activation="softmax")(inner(inputs))
        return keras.Model(inputs, outputs)

    def trained(model):
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        return model

    x, y = models.data()
    reference = build()
    reference.compile(optimizer=models.sgd(keras), **models.COMPILE)
    model = build()
    agnostic.backend_agnostic_compile(model, optimizer=models.sgd(keras), gpus=2,
                                      **models.COMPILE)
    unsynchronized = build()
    agnostic.backend_agnostic_compile(unsynchronized, optimizer=models.sgd(keras), gpus=2,
                                      sync_batch_norm=False, **models.COMPILE)
    expected = trained(reference).get_weights()
    assert models.relative_difference(expected, trained(model).get_weights()) < 1e-5
    # Per-replica statistics would differ: the test can tell.
    assert models.relative_difference(expected, trained(unsynchronized).get_weights()) > 1e-4
    # The layer's config is as the program made it: the file loads anywhere.
    assert model.layers[1].layers[1].get_config()["synchronized"] is False


@pytest.mark.parametrize("replicas", [2, 4])
def test_batch_statistics_are_one_devices_two_passes_where_one_pass_loses_them(replicas):
    # Inputs around 1000 with a spread of 0.05 (a raw measurement normalised
    # by the model's first layer): one device's tf.nn.moments takes two
    # passes, mean then squared deviations; Keras's synchronized=True takes
    # one, E[x²] - E[x]², and float32 keeps nothing of a variance of 0.0025
    # next to 1e6 (its moving variance came out 0.0039 to 0.062 for 0.0063).
    rng = np.random.default_rng(0)
    x = (1000 + 0.05 * rng.standard_normal((256, 8))).astype("float32")
    y = rng.standard_normal((256, 1)).astype("float32")

    def trained(compile, synchronized=False):
        models.seed(keras, 1)
        model = keras.Sequential([
            keras.Input((8,)),
            keras.layers.BatchNormalization(momentum=0.5, synchronized=synchronized),
            keras.layers.Dense(1)])
        compile(model, optimizer=keras.optimizers.SGD(0.01), loss="mse")
        model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
        return model

    reference = trained(keras.Model.compile)
    model = trained(lambda model, **kw: agnostic.backend_agnostic_compile(
        model, gpus=replicas, **kw))
    expected = reference.get_weights()
    assert models.relative_difference(expected, model.get_weights()) < 1e-5
    np.testing.assert_allclose(np.asarray(model.layers[0].moving_variance),
                               np.asarray(reference.layers[0].moving_variance), rtol=1e-4)
    # The one-pass formula, on one device already, is what the test tells apart.
    one_pass = trained(keras.Model.compile, synchronized=True)
    assert models.relative_difference(expected, one_pass.get_weights()) > 1e-5
    assert not np.allclose(np.asarray(one_pass.layers[0].moving_variance),
                           np.asarray(reference.layers[0].moving_variance), rtol=1e-2)


def test_a_model_taking_raw_strings_trains_like_one_device(tmp_path):
    # keras.io's end-to-end text classifier: strings gathered to every
    # replica as their bytes, then each replica vectorizes its part.
    from tests.test_programs import assert_two_devices_train_like_one

    assert_two_devices_train_like_one("raw_text", tmp_path)


def test_an_optimizer_built_and_excluding_weights_from_decay_trains_as_on_one_device():
    # The optimizer keys variables by their engine variables, which
    # agnostic makes again: its exclusions and, compiled again with the same
    # (built) optimizer, its indices follow them.
    x, y = models.data()

    def trained(compile):
        model = models.build(keras)
        optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.5)
        optimizer.exclude_from_weight_decay(var_list=[model.layers[-1].kernel])
        for _ in range(2):
            compile(model, optimizer=optimizer, **models.COMPILE)
            model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        return model.get_weights()

    expected = trained(lambda model, **kwargs: model.compile(**kwargs))
    actual = trained(lambda model, **kwargs: agnostic.backend_agnostic_compile(
        model, gpus=2, **kwargs))
    assert models.relative_difference(expected, actual) < 1e-5


def test_the_engines_functions_are_replaced_only_while_a_step_runs():
    # compat/scoped.py: Keras's loss scaling and TensorFlow's maybe_merge_call
    # are agnostic's inside its steps (as they are traced) and the engines'
    # own everywhere else, after training too.
    from keras.src.losses import loss as losses

    interim = tf.__internal__.distribute.interim

    def current():
        return (losses.scale_loss_for_distribution, losses.unscale_loss_for_distribution,
                interim.maybe_merge_call)

    own, seen = current(), []

    class Probe(keras.layers.Layer):
        def call(self, inputs):
            seen.append(current() == own)
            return inputs

    template = keras.Sequential([keras.Input((4,)), Probe(), keras.layers.Dense(2)])
    model = agnostic.backend_agnostic_compile(template, optimizer=keras.optimizers.SGD(0.1),
                                              loss="mse", gpus=2)
    x, y = np.ones((16, 4), "float32"), np.zeros((16, 2), "float32")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert False in seen  # replaced inside the step
    assert current() == own
    model.evaluate(x, y, batch_size=8, verbose=0)
    assert current() == own
