"""The user's model distributed where it is: a Keras variable's engine
variable made again where the active scope puts new ones (Keras 3.13-3.16).

Keras makes a variable's engine variable once, when the variable is made
(`KerasVariable._initialize`, private): inside a tf.distribute strategy's
scope a mirrored one, inside a keras.distribution's scope an array laid out
on its mesh, inside keras.device() one on that device. agnostic makes it
again from its current value inside the plan's scope, so that the user's own
Keras variables (and every layer, optimizer and metric holding them) train
on every device; nothing is copied or rebuilt. With TensorFlow, a model and
its optimizers also record the strategy they were made under
(`_distribute_strategy`, `_distribution_strategy`), and an optimizer built
already keys its variables by their engine variables.
"""
import contextlib

from agnostic.compat import versions


def made_again(variable):
    """`variable`'s engine variable, made again from its value in the
    active scope (TensorFlow, JAX; torch: see `moved`)."""
    import keras

    if not callable(getattr(variable, "_initialize", None)):
        raise versions.moved("KerasVariable._initialize (how a variable is made)")
    engine = keras.backend.backend()
    if engine == "tensorflow":
        old = _tf_key(variable.value)
        variable._initialize(_tf_variable_like(variable))
        _TF_KEYS[old] = _tf_key(variable.value)
    elif engine == "jax":
        if "_layout" not in vars(variable):
            raise versions.moved("JaxVariable._layout (a variable's place on the mesh)")
        value = variable.value
        variable._layout = None  # the active distribution's layout, as at creation
        variable._initialize(value)
    else:
        raise ValueError(f"made_again: no engine variable to make again on {engine}")


def probe(keras):
    """What this module relies on (agnostic/compat/registry.py), run on a
    variable, a 1-layer model and a built optimizer made here: a variable
    made again keeps its value (TensorFlow, JAX; torch: moved in place);
    with TensorFlow, the model's and optimizer's strategy attributes and the
    optimizer's variable indices; with JAX, a variable's `_value` and
    `_layout` (`local_values`)."""
    import numpy as np

    engine = keras.backend.backend()
    variable = keras.Variable(np.arange(2.0, dtype="float32"))
    known = set(_TF_KEYS)
    try:
        if engine == "torch":
            moved(variable, variable.value.device)
        else:
            made_again(variable)
    finally:
        for key in set(_TF_KEYS) - known:  # this variable's only
            del _TF_KEYS[key]
    versions.expect(bool(keras.ops.all(variable.value == keras.ops.arange(2.0))),
                    "KerasVariable._initialize making a variable again from its value")
    if engine == "tensorflow":
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD()
        optimizer.build(model.trainable_variables)
        train_under(model, strategy)
        optimizer_under(optimizer, strategy)
        versions.expect(in_strategy(variable, strategy) in (True, False),
                        "a variable's value (the tf.Variable it holds)")
    elif engine == "jax":
        with local_values([variable]):
            versions.expect(variable._layout is None, "JaxVariable._layout")
        versions.expect(bool(keras.ops.all(variable.value == keras.ops.arange(2.0))),
                        "JaxVariable._value (a variable's array)")


# TensorFlow: an optimizer keys a variable by its engine variable's id
# (TFOptimizer._var_key); old id -> new id of each variable made again.
_TF_KEYS = {}


def _tf_key(value):
    import tensorflow as tf

    if isinstance(value, tf.distribute.DistributedValues):
        return value._unique_id
    container = getattr(value, "_distributed_container", None)
    if container is None:
        container = getattr(getattr(value, "handle", None), "_distributed_container", None)
    return (container() if container is not None else value)._unique_id


def _tf_variable_like(variable):
    """A tf.Variable made in the active scope with the value and settings of
    `variable`'s, trainable as the old one was made: TensorFlow watches only
    trainable engine variables, and Keras's flag (a frozen layer, unfrozen
    later for fine-tuning) never changes the engine's."""
    import tensorflow as tf

    old = variable.value
    return tf.Variable(
        tf.convert_to_tensor(old), dtype=old.dtype, trainable=old.trainable,
        name=variable.name, aggregation=variable._map_aggregation(variable.aggregation),
        synchronization=variable._map_synchronization(variable.synchronization),
    )


def moved(variable, device):
    """torch: the variable's tensor moved to `device` in place (the module
    keeps the same Parameter, which DistributedDataParallel and the
    optimizer hold)."""
    import torch

    with torch.no_grad():
        variable.value.data = variable.value.data.to(device)


def in_strategy(variable, strategy):
    """TensorFlow: whether `variable` was made under `strategy` already."""
    return strategy.extended.variable_created_in_scope(variable.value)


def train_under(model, strategy):
    """TensorFlow: `model`'s fit, evaluate and predict run under `strategy`,
    as for a model made in its scope."""
    if "_distribute_strategy" not in vars(model):
        raise versions.moved("TensorFlowTrainer._distribute_strategy")
    model._distribute_strategy = strategy


def optimizer_under(optimizer, strategy):
    """TensorFlow: `optimizer` updates its variables through `strategy`, as
    one made in its scope; one built already finds its variables again."""
    if "_distribution_strategy" not in vars(optimizer):
        raise versions.moved("TFOptimizer._distribution_strategy")
    optimizer._distribution_strategy = strategy
    rekeyed(optimizer)


def rekeyed(optimizer):
    """The optimizer finds its variables again by their new engine variables:
    the indices of a built one, the weight decay each gets (Keras 3.16), the
    variables excluded from weight decay (`exclude_from_weight_decay`)."""
    for name in ("_trainable_variables_indices", "_weight_decay_by_var_key"):
        keyed = getattr(optimizer, name, None)
        if isinstance(keyed, dict):
            setattr(optimizer, name, {_TF_KEYS.get(key, key): value
                                      for key, value in keyed.items()})
        elif name == "_trainable_variables_indices":
            raise versions.moved("BaseOptimizer._trainable_variables_indices")
    excluded = getattr(optimizer, "_exclude_from_weight_decay", None)
    if isinstance(excluded, (set, frozenset)):
        optimizer._exclude_from_weight_decay = {_TF_KEYS.get(key, key) for key in excluded}


@contextlib.contextmanager
def local_values(variables, on_host=False):
    """JAX, several processes: each variable holds this process's own whole
    copy of its value while the block runs (replicated: its first device's;
    split over the processes, shard=True: gathered from every process, which
    must all enter), then its value over every process's devices again.
    `on_host`: a gathered value stays in host memory (a save reads it there),
    not on the first device."""
    import jax
    from jax.experimental import multihost_utils

    kept = []
    for variable in variables:
        value = variable.value
        shards = getattr(value, "addressable_shards", None)
        if not shards or "_value" not in vars(variable) or "_layout" not in vars(variable):
            raise versions.moved("JaxVariable._value and _layout (a variable's array)")
        # Without a layout, what Keras writes back after predict stays
        # local; a copy, since predict donates the buffers it is given.
        kept.append((variable, value, variable._layout))
        if value.sharding.is_fully_replicated:
            local = shards[0].data.copy()
        else:
            whole = multihost_utils.process_allgather(value, tiled=True)
            local = whole if on_host else jax.device_put(whole, shards[0].device)
        variable._value, variable._layout = local, None
    try:
        yield
    finally:
        for variable, value, layout in kept:
            variable._value, variable._layout = value, layout
