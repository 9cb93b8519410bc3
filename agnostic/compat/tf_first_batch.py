"""TensorFlow: the model is built before training without reading a batch.

Under a tf.distribute strategy, Keras 3.13-3.15 build the model at the start
of every `fit` and `evaluate` (`TensorFlowTrainer._maybe_symbolic_build`,
private) from a batch read off a fresh distributed iterator over the data.
That read costs a one-pass source its first batches (a Python generator
loses the batch and what the iterator prefetched: one device trains on
batches 0-5, two devices on 0, 1, 6-9) and moves seeded shuffles one
iteration on, so the batches differ from one device's; across workers Keras
also averages that batch, which the engine refuses. The build needs only
shapes and dtypes, so this builds from the distributed dataset's element
spec and reads nothing. A model without a `call` of its own (a GAN's step
calls its parts) is not built there, as Keras does without a strategy.
"""


def build_without_reading(model, strategy, scope=None):
    """Replaces `model`'s first-batch build by one from the data's spec,
    made in `scope()` (the strategy's scope by default)."""
    import keras

    if not callable(getattr(model, "_symbolic_build", None)):
        raise RuntimeError(
            "agnostic builds the model from the data's spec through "
            f"Model._symbolic_build, which Keras {keras.__version__} no longer has. "
            "Report this Keras version to agnostic."
        )

    def build(iterator=None, data_batch=None):
        if not model.built and type(model).call is keras.Model.call:
            # No call to build from (a GAN's or VAE's step calls its parts):
            # as without a strategy, state is made as the step first runs.
            return
        if data_batch is None and iterator is not None:
            data_batch = _symbolic_batch(_element_spec(iterator))
        with (scope or strategy.scope)():
            model._symbolic_build(data_batch=data_batch)

    model.__dict__["_maybe_symbolic_build"] = build


def _element_spec(iterator):
    dataset = getattr(iterator, "_distributed_dataset", None)
    if dataset is None:
        import keras

        raise RuntimeError(
            "agnostic reads the data's spec from the epoch iterator's "
            f"_distributed_dataset, which Keras {keras.__version__} no longer has. "
            "Report this Keras version to agnostic."
        )
    return dataset.element_spec


def _symbolic_batch(spec):
    """Symbolic tensors shaped as one replica's part of a batch."""
    import keras
    import tensorflow as tf

    def symbolic(one):
        one = getattr(one, "_value_specs", (one,))[0]  # a PerReplicaSpec's first
        if one is None:
            return None
        return keras.KerasTensor(
            tuple(one.shape.as_list()), dtype=one.dtype.name,
            sparse=isinstance(one, tf.SparseTensorSpec),
            ragged=isinstance(one, tf.RaggedTensorSpec),
        )

    return tf.nest.map_structure(symbolic, spec)
