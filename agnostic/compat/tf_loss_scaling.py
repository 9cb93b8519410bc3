"""TensorFlow: a train_step of the user's own reports losses as one device.

Keras 3.13-3.16 divide every loss computed inside a tf.distribute strategy
by the number of replicas (`keras.src.losses.loss.scale_loss_for_distribution`,
private), so that the replicas' gradients, which the optimizer sums, make
the mean. Keras's own train_step and test_step multiply the tracked loss
back (`unscale_loss_for_distribution`); a step written as the Keras guide
shows does not, and its loss tracker reports 1/N of one device's loss. So
within the steps of a model whose class writes its own, the losses stay as
one device computes them, and every optimizer the step applies gradients
with divides them by N instead (`apply` on the model's optimizers'
instances, gated to those steps): the same update, and the numbers a user
tracks are one device's. Keras's loss scaling functions are replaced only
while such a step runs (compat/scoped.py).
"""
import threading

from agnostic.compat import scoped, versions
from agnostic.compat.tf_gradients import LOSS_SCALING, loss_scaling

_inside = threading.local()  # replicas trace their steps on threads of their own

STEPS = ("train_step", "test_step")


def own_steps(model):
    """The step methods that `model`'s class defines instead of Keras's."""
    import keras

    # keras.Model's steps are the engine trainer's (its class is named
    # TensorFlowTrainer up to Keras 3.15, Trainer in 3.16).
    return [name for name in STEPS
            if getattr(type(model), name) is not getattr(keras.Model, name)]


def keep_losses_unscaled(model, num_replicas, optimizers):
    """For a model with steps of its own: losses unscaled in those steps,
    gradients applied in them by each of `optimizers` (the model's, a GAN's
    two, a loss-scale optimizer's inner one) divided by `num_replicas`, once."""
    from agnostic import methods

    steps = own_steps(model)
    if not steps:
        return False
    loss_scaling(LOSS_SCALING[0])  # a CompatError now, not in the first step

    def unscaled(step):
        def run(*args, **kwargs):
            _inside.depth = getattr(_inside, "depth", 0) + 1
            _inside.replicas = num_replicas
            try:
                with _PATCHES.active():
                    return step(*args, **kwargs)
            finally:
                _inside.depth -= 1

        return run

    for name in steps:
        methods.wrap_method(model, name, unscaled)
    for optimizer in optimizers:
        methods.wrap_method(optimizer, "apply", _averaged)
    return True


def _active():
    return getattr(_inside, "depth", 0) > 0


def _replacements():
    from keras.src.losses import loss as losses

    for name in LOSS_SCALING:
        loss_scaling(name)  # there, or a CompatError naming the Keras version
        yield losses, name, _skipped_inside_own_steps


_PATCHES = scoped.Patches(_replacements)


def probe(keras):
    """What the replacements and `own_steps` rely on (agnostic/compat/registry.py):
    Keras's loss scaling functions, each called with the loss alone;
    `BaseOptimizer.apply(grads, trainable_variables)`, which the wrapper
    calls; and Keras's own model having no steps of its own."""
    from keras.src.optimizers import base_optimizer

    for name in LOSS_SCALING:
        versions.expect(versions.takes(loss_scaling(name), "value"),
                        f"keras.src.losses.loss.{name}(value)")
    versions.expect(versions.takes(base_optimizer.BaseOptimizer.apply, "grads",
                                   "trainable_variables"),
                    "BaseOptimizer.apply(grads, trainable_variables)")
    versions.expect(own_steps(keras.Sequential()) == [],
                    "keras.Model's train_step and test_step being the engine trainer's")


def _averaged(apply):
    def run(grads, trainable_variables=None):
        if not _active() or getattr(_inside, "dividing", False):
            return apply(grads, trainable_variables)
        _inside.dividing = True
        try:
            grads = [_divide(g, _inside.replicas) for g in grads]
            return apply(grads, trainable_variables)
        finally:
            _inside.dividing = False

    return run


def _skipped_inside_own_steps(function):
    def run(value):
        return value if _active() else function(value)

    return run


def _divide(gradient, num_replicas):
    import tensorflow as tf

    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values / num_replicas, gradient.indices,
                                gradient.dense_shape)
    return gradient / num_replicas
