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
            self._candidates = _candidates(model) if replicas > 1 else []
            self._before = self._fingerprints()

        def on_train_batch_end(self, batch, logs=None):
            before, self._before = self._before, {}
            if not before:
                return
            changed = [name for name, print_ in self._fingerprints().items()
                       if print_ != before[name]]
            if changed and is_chief:
                warnings.warn(
                    f"{', '.join(changed)} changed in a training step with no declared "
                    f"aggregation: each of the {replicas} replicas computed it from its "
                    "own share of the batch and one replica's value is kept, which may "
                    f"not be one device's. To make it one device's, {FIX}.",
                    UserWarning, stacklevel=2)

        def _fingerprints(self):
            """{description: (sum, sum of squares)} of each candidate variable."""
            found = {}
            for name, variable in self._candidates:
                value = keras.ops.cast(variable.value, "float32")
                found[name] = tuple(float(keras.ops.convert_to_numpy(keras.ops.sum(v)))
                                    for v in (value, keras.ops.square(value)))
            return found

    return CheckLayerState()


def _candidates(model):
    """[(description, variable)]: the non-trainable variables of `model`'s
    layers with no declared aggregation, but for batch normalization's moving
    statistics and the seed generators' states."""
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
    return [(f"variable {variable.path!r} of layer {layer.name!r}", variable)
            for layer, variable in owner.values()]
