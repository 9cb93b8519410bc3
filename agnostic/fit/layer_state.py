"""A layer's own state that a training step changes without a declared
aggregation: one warning, from the chief, naming it and the fix.

On TensorFlow and torch each replica runs a layer's call on its own share of
the batch (agnostic/fit/global_batch.py gathers what the step computes over the
batch, not what a call writes to its own variables). A non-trainable weight
declared with `aggregation="sum"`, `"mean"` or `"only_first_replica"` is
combined as it says (tf_central_metrics, torch_ddp); one left at Keras's
`"none"` cannot be: one replica's value is kept, computed from its share
alone. fit checks the candidates once, over its first training step (its
first call of the train function): each one's sum and sum of squares
(computed where the variable lives) before and after.
A SeedGenerator's state and batch normalization's moving statistics are
left out: agnostic keeps those one device's. JAX's one program sees the
global batch: nothing to check there.
"""
import warnings

FIX = ('declare how replicas combine it: add_weight(..., aggregation="sum") for a '
       'count, "mean" for an average of equal shares, "only_first_replica" for a '
       "value every replica computes alike")


def callback(model, replicas, is_chief):
    """A Keras callback for fit that warns (on the chief) about each of
    `model`'s undeclared variables its first training steps changed."""
    import keras

    class CheckLayerState(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self._before = _fingerprints(model) if replicas > 1 else {}

        def on_train_batch_end(self, batch, logs=None):
            before, self._before = self._before, {}
            if not before:
                return
            changed = [name for name, print_ in _fingerprints(model).items()
                       if name in before and print_ != before[name]]
            if changed and is_chief:
                warnings.warn(
                    f"{', '.join(changed)} changed in a training step with no declared "
                    f"aggregation: each of the {replicas} replicas computed it from its "
                    "own share of the batch and one replica's value is kept, which may "
                    f"not be one device's. To make it one device's, {FIX}.",
                    UserWarning, stacklevel=2)

    return CheckLayerState()


def _fingerprints(model):
    """{description: (sum, sum of squares)} of each candidate variable."""
    import keras

    from agnostic.fit import batch_norm
    from agnostic.compat import keras_fit, random_draws

    left_out = {id(v) for v in batch_norm.moving_statistics(model)}
    owners = [model] + keras_fit.every_layer(model)
    left_out.update(id(state) for state in random_draws.generator_states(owners))
    owner = {}
    for layer in owners:  # parents before their layers: the innermost one is kept
        for variable in layer.non_trainable_weights:
            if id(variable) not in left_out and getattr(variable, "aggregation", None) == "none":
                owner[id(variable)] = (layer, variable)
    found = {}
    for layer, variable in owner.values():
        value = keras.ops.cast(variable.value, "float32")
        name = f"variable {variable.path!r} of layer {layer.name!r}"
        found[name] = tuple(float(keras.ops.convert_to_numpy(keras.ops.sum(v)))
                            for v in (value, keras.ops.square(value)))
    return found
