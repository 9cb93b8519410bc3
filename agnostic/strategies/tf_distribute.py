"""The TensorFlow steps every tf.distribute strategy of agnostic's takes
(tf-mirrored, tf-central-storage, tf-multi-worker): the program's model
trains under the strategy itself."""
from agnostic import batch_norm, in_place
from agnostic.compat import keras_variables, tf_first_batch, tf_gradients, tf_on_batch


def distribute(model, strategy, scope, call, sync_batch_norm):
    """The program's model trains under `strategy`: compiled in `scope()`,
    its state made again there, its batch normalization over the global
    batch (`sync_batch_norm`), its steps fixed where Keras needs help."""
    keras_variables.train_under(model, strategy)
    batch_norm.synchronize(model, sync_batch_norm)
    in_place.compile_in(model, scope(), call,
                        placed=lambda variable: keras_variables.in_strategy(variable, strategy))
    optimizers = in_place.optimizers(model, call)
    for optimizer in optimizers:
        keras_variables.optimizer_under(optimizer, strategy)
    tf_gradients.one_device_arithmetic(model, optimizers)
    tf_first_batch.build_without_reading(model, strategy, scope)
    tf_on_batch.split_batches(model, strategy)
