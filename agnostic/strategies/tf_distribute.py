"""The TensorFlow steps every tf.distribute strategy of agnostic's takes
(tf-mirrored, tf-central-storage, tf-multi-worker): the program's model
trains under the strategy itself."""
from agnostic import batch_norm, in_place
from agnostic.compat import (keras_variables, tf_first_batch, tf_gradients, tf_loss_scaling,
                             tf_on_batch)


def distribute(model, strategy, scope, call, sync_batch_norm, one_device_arithmetic=True):
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
    if one_device_arithmetic:
        tf_gradients.one_device_arithmetic(model, optimizers)
    else:  # tf-multi-worker, for now: Keras's arithmetic, losses of own steps kept
        tf_loss_scaling.keep_losses_unscaled(model, strategy.num_replicas_in_sync)
    tf_first_batch.build_without_reading(model, strategy, scope)
    tf_on_batch.split_batches(model, strategy)
