"""Variables whose replicas' updates TensorFlow adds up: metric totals on
variables stored once (tf-central-storage), and a layer's own state declared
`aggregation="sum"` (every tf.distribute strategy), Keras 3.13-3.16.

Keras adds to a variable by assigning `value + delta`; where the engine sums
what every replica writes, each step would add the old total once per
replica (a sample counter doubling each step). Each such variable gets the
engine's own in-place add instead (`variable.value`, the engine's variable,
is the Keras variable's public handle on it); without it, an error names the
Keras version.
"""
from agnostic.compat import versions


def update_in_place(model):
    """Metric totals add each device's part once.

    Keras 3.13-3.16 add to a variable by assigning `value + delta`
    (`assign_add`, and metrics such as Precision, AUC, TruePositives call
    `assign(variable + delta)` themselves); on a variable stored once and
    summed over the devices, every step would then add the old total once
    per device (measured: counts 240 instead of 64 over one epoch on 2
    devices). Metric variables exist once the step functions are made (Keras
    builds the metrics from a first batch), so before that, each one is
    given the engine's own in-place add, and in a step an `assign` adds its
    difference from the stored value.
    """
    return added_in_place(model, lambda: model.metrics_variables)


def summed_state_in_place(model):
    """A layer's own variables declared `aggregation="sum"` (a counter
    updated in its call) add each replica's part once."""
    return added_in_place(model, lambda: [variable for variable in model.non_trainable_variables
                                          if variable.aggregation == "sum"])


def added_in_place(model, variables):
    """Each of `variables()` adds in place (see above), given before the
    model's step functions are made (the variables exist then: Keras builds
    the model and its metrics from a first batch). Returns the wraps, for
    methods.wrap_all."""
    def before(original):
        def run(*args, **kwargs):
            for variable in variables():
                if "assign_add" not in vars(variable):
                    variable.assign_add = _in_place(variable, "assign_add")
                    variable.assign_sub = _in_place(variable, "assign_sub")
                    variable.assign = _assigned_as_added(variable)
            return original(*args, **kwargs)

        return run

    return [(model, name, before) for name in ("make_train_function", "make_test_function")]


def probe(keras):
    """What the in-place adds rely on (agnostic/compat/registry.py): a
    model's `metrics_variables`, its `make_train_function` and
    `make_test_function`, and a metric variable's `value` being the
    tf.Variable that the engine's add updates in place."""
    model = keras.Sequential([keras.layers.Dense(1)])
    for name in ("metrics_variables", "make_train_function", "make_test_function"):
        versions.expect(hasattr(model, name), f"Model.{name}")
    variable = keras.metrics.Sum().variables[0]
    _in_place(variable, "assign_add")(2.0)
    versions.expect(float(_stored(variable).numpy()) == 2.0 == float(variable.numpy()),
                    "a metric variable's value (the tf.Variable it holds) added to in place")


def _stored(variable):
    """The engine's variable under a Keras metric variable (on the CPU)."""
    import tensorflow as tf

    stored = getattr(variable, "value", None)
    if not isinstance(stored, tf.Variable):
        raise versions.moved(f"{type(variable).__name__}.value (the tf.Variable it holds)")
    return stored


def _in_place(variable, name):
    import tensorflow as tf

    stored = _stored(variable)

    def update(delta):
        return getattr(stored, name)(tf.cast(delta, stored.dtype))

    return update


def _assigned_as_added(variable):
    """`assign(new)` in a replica's step: adds `new - stored`, which the
    engine sums over the replicas once; elsewhere (a reset) an assignment."""
    import tensorflow as tf

    stored = _stored(variable)
    assign = variable.assign

    def update(value):
        if tf.distribute.in_cross_replica_context():
            return assign(value)
        value = tf.cast(value, stored.dtype)
        return stored.assign_add(value - tf.identity(stored))

    return update
