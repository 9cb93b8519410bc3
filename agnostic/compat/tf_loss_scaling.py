"""TensorFlow: the module functions that one device's gradient arithmetic
(engines/tensorflow/gradients.py) replaces while a replica's step runs.

Keras 3.13-3.16 under a strategy divide every loss by the number of
replicas (`keras.src.losses.loss.scale_loss_for_distribution` and its
inverse, private): inside agnostic's steps a loss is left as one device
computes it. TensorFlow's `maybe_merge_call` (private,
`tf.__internal__.distribute.interim`), through which Keras's optimizer
reaches its update, assumes a replica context: an `apply` that agnostic runs
once in the cross-replica context calls the update directly there.

Both are replaced only within `one_device_losses()` (compat/scoped.py): a
program that never compiles with agnostic, and every step outside it, sees
the engine's own functions.
"""
import contextlib
import threading

from agnostic import errors
from agnostic.compat import scoped, versions

LOSS_SCALING = ("scale_loss_for_distribution", "unscale_loss_for_distribution")

_inside = threading.local()  # replicas trace their steps on threads of their own


@contextlib.contextmanager
def one_device_losses():
    """Within, on this thread, Keras's loss scaling leaves a loss as it is
    and `maybe_merge_call` runs its function directly across replicas."""
    previous = getattr(_inside, "step", False)
    _inside.step = True
    try:
        with _PATCHES.active():
            yield
    finally:
        _inside.step = previous


def check():
    """Raises CompatError now, at compile, where Keras no longer has the
    loss scaling replaced in the steps (not in the first step)."""
    loss_scaling(LOSS_SCALING[0])


def _replacements():
    """What the steps need replaced while they run (compat/scoped.py)."""
    import tensorflow as tf
    from keras.src.losses import loss as losses

    interim = tf.__internal__.distribute.interim
    yield interim, "maybe_merge_call", _direct_across_replicas
    for name in LOSS_SCALING:
        loss_scaling(name)  # there, or a CompatError naming the Keras version
        yield losses, name, _skipped_in_steps


_PATCHES = scoped.Patches(_replacements)


def loss_scaling(name):
    """Keras's keras.src.losses.loss.`name` (one of LOSS_SCALING), or a
    CompatError naming the Keras version."""
    from keras.src.losses import loss as losses

    function = getattr(losses, name, None)
    if not callable(function):
        import keras

        raise errors.CompatError(
            f"agnostic keeps the losses of a step as one device computes them through "
            f"keras.src.losses.loss.{name}, which Keras {keras.__version__} no "
            "longer has. Report this Keras version to agnostic."
        )
    return function


def probe(keras):
    """What `_replacements` and the wrapped steps rely on (agnostic/compat/registry.py):
    Keras's loss scaling functions, which leave a loss as it is outside a
    strategy; TensorFlow's `maybe_merge_call(fn, strategy, ...)`; and the
    optimizer methods engines/tensorflow/gradients.py wraps, with the
    parameters its wrappers pass."""
    import tensorflow as tf
    from keras.src.optimizers import base_optimizer

    for name in LOSS_SCALING:
        function = loss_scaling(name)
        versions.expect(versions.takes(function, "value"),
                        f"keras.src.losses.loss.{name}(value)")
        versions.expect(float(function(tf.constant(2.0))) == 2.0,
                        f"keras.src.losses.loss.{name} leaving a loss as it is "
                        "outside a strategy")
    merge = getattr(tf.__internal__.distribute.interim, "maybe_merge_call", None)
    versions.expect(versions.takes(merge, "fn", "strategy"),
                    "tf.__internal__.distribute.interim.maybe_merge_call(fn, strategy, ...)")
    optimizer = base_optimizer.BaseOptimizer
    versions.expect(versions.takes(optimizer.apply, "grads", "trainable_variables"),
                    "BaseOptimizer.apply(grads, trainable_variables)")
    versions.expect(versions.takes(optimizer.scale_loss, "loss"), "BaseOptimizer.scale_loss(loss)")


def _direct_across_replicas(maybe_merge_call):
    def run(fn, strategy, *args, **kwargs):
        import tensorflow as tf

        if tf.distribute.in_cross_replica_context():
            return fn(strategy, *args, **kwargs)
        return maybe_merge_call(fn, strategy, *args, **kwargs)

    return run


def _skipped_in_steps(function):
    def run(value):
        return value if getattr(_inside, "step", False) else function(value)

    return run
