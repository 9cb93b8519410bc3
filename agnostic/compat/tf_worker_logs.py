"""tf-multi-worker: a step's logs across workers (Keras 3.13-3.16).

Keras averages each step's logs over the workers along axis 0, which a
scalar metric does not have ("Invalid reduction dimension 0"): each replica
reports its values with a leading axis of 1, so the average over that axis
is the average over the replicas, whatever the shape. The wrapped methods
are the documented train_step and test_step.
"""
from agnostic.compat import versions


def probe(keras):
    """What the reshaped logs rely on (agnostic/compat/registry.py): Keras
    reduces a step's logs with `reduce_per_replica(values, strategy,
    reduction)`, across workers the mean along axis 0 (read from its source:
    a multi-worker strategy cannot be made here)."""
    import inspect

    from keras.src.backend.tensorflow import trainer

    reduce = getattr(trainer, "reduce_per_replica", None)
    versions.expect(versions.takes(reduce, "values", "strategy", "reduction"),
                    "keras.src.backend.tensorflow.trainer.reduce_per_replica")
    versions.expect('strategy.reduce("MEAN", v, axis=0)' in inspect.getsource(reduce),
                    "reduce_per_replica taking the mean of a step's logs over the "
                    "workers along axis 0")


def one_value_per_replica(model):
    """Each replica reports its logs with a leading axis of 1."""
    import tensorflow as tf

    def reshaped(original):
        def run(data):
            return tf.nest.map_structure(lambda v: tf.expand_dims(v, 0), original(data))

        return run

    return [(model, name, reshaped) for name in ("train_step", "test_step")]
