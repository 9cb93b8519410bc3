"""TensorFlow: the model is built before training without reading a batch.

Under a tf.distribute strategy, Keras 3.13-3.16 build the model at the start
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
from agnostic.compat import versions


def build_without_reading(model, strategy, scope=None):
    """Replaces `model`'s first-batch build by one from the data's spec,
    made in `scope()` (the strategy's scope by default)."""
    import keras

    _check_symbolic_build(model)

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


def _check_symbolic_build(model):
    if not callable(getattr(model, "_symbolic_build", None)):
        raise versions.moved("Model._symbolic_build (the model built from the data's spec)")


def probe(keras):
    """What the build relies on (agnostic/compat/registry.py): the model's
    `_symbolic_build(data_batch=...)`; Keras calling `_maybe_symbolic_build`
    with `iterator` or `data_batch`; and the spec of a TensorFlow epoch
    iterator's `_distributed_dataset`, made into symbolic tensors shaped as
    its batches."""
    import numpy as np
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    model = keras.Sequential([keras.layers.Dense(1)])
    _check_symbolic_build(model)
    versions.expect(versions.takes(model._symbolic_build, "data_batch"),
                    "Model._symbolic_build(data_batch=...)")
    versions.expect(versions.takes(type(model)._maybe_symbolic_build, "iterator", "data_batch"),
                    "Model._maybe_symbolic_build(iterator, data_batch)")
    versions.expect(versions.takes(keras.KerasTensor, "shape", "dtype", "sparse", "ragged"),
                    "keras.KerasTensor(shape, dtype, sparse, ragged)")
    iterator = trainer.TFEpochIterator(distribute_strategy=tf.distribute.get_strategy(),
                                       x=np.zeros((4, 3), "float32"), batch_size=2)
    batch = _symbolic_batch(_element_spec(iterator))
    versions.expect(tuple(keras.tree.flatten(batch)[0].shape)[1:] == (3,),
                    "TFEpochIterator._distributed_dataset's element spec (the batches' shapes)")


def _element_spec(iterator):
    dataset = getattr(iterator, "_distributed_dataset", None)
    if dataset is None:
        raise versions.moved("TFEpochIterator._distributed_dataset (the data's spec)")
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
