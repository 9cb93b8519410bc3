"""The TensorFlow steps every tf.distribute strategy of agnostic's takes
(tf-mirrored, tf-central-storage, tf-multi-worker): the program's model
trains under the strategy itself."""
import contextlib
import functools

from agnostic import errors
from agnostic.fit import batch_norm, global_batch, in_place
from agnostic.compat import (keras_variables, step_logs, tf_central_metrics, tf_first_batch,
                             tf_on_batch)
from agnostic.engines.tensorflow import batch_view, gradients


def distribute(model, strategy, scope, call, sync_batch_norm, global_view=True):
    """The program's model trains under `strategy`: compiled in `scope()`,
    its state made again there, its batch normalization over the global
    batch (`sync_batch_norm`), its steps fixed where Keras needs help, and
    (`global_view`) run over the global batch on every replica. Returns the
    model's wrappers, innermost first, for pipeline.wrap to apply."""
    batch_norm.synchronize(model, "tensorflow", sync_batch_norm)
    metrics_scope = batch_view.first_replicas_metrics if global_view \
        else contextlib.nullcontext
    # The strategy set before compile, which reads it.
    call = call.around(before=functools.partial(keras_variables.train_under, strategy=strategy))
    optimizers, trackers = in_place.compile_in(
        model, _within(scope(), metrics_scope()), call,
        placed=lambda variable: _placed(variable, strategy, global_view))
    for optimizer in optimizers:
        keras_variables.optimizer_under(optimizer, strategy)
    wraps = gradients.one_device_arithmetic(model, optimizers, trackers, global_view)
    wraps += step_logs.metrics_in_place(model, summed=not global_view)
    wraps += tf_central_metrics.summed_state_in_place(model)
    if global_view:
        wraps += global_batch.see_the_global_batch(model, batch_view.view)
        wraps += [(model, name, _made_in(metrics_scope)) for name in global_batch.STEPS]
    wraps += tf_on_batch.split_batches(model, strategy)
    tf_first_batch.build_without_reading(model, strategy, scope)
    return wraps


def _placed(variable, strategy, global_view):
    """Whether `variable` is where the plan wants it already (a metric's,
    under the global view, is made again to be read from the first replica)."""
    if global_view and variable.synchronization == "on_read":
        return False
    return keras_variables.in_strategy(variable, strategy)


@contextlib.contextmanager
def _within(outer, inner):
    with outer, inner:
        yield


def _made_in(scope):
    """A step in which the variables made (the compiled metrics', built at
    the first step) are made in `scope()`."""
    def wrapper(step):
        def run(*args, **kwargs):
            with scope():
                return step(*args, **kwargs)

        return run

    return wrapper


def users_strategy(plan, wanted, central=False):
    """The tf.distribute strategy in whose scope the program compiles, when
    it is a `wanted` (a tf.distribute class) over the plan's replicas (Ray's
    and TensorFlow's guides make a MultiWorkerMirroredStrategy in the
    training function): agnostic trains under it rather than beside it.
    None outside any scope; another kind, or any with `central` (agnostic's
    CentralStorageStrategy), is an error before anything is built."""
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return None
    current = tf.distribute.get_strategy()
    if isinstance(current, wanted) and not central \
            and current.num_replicas_in_sync == plan.num_replicas:
        return current
    relocated = " with cpu_relocation=True (a CentralStorageStrategy)" if central else ""
    raise errors.NotSupportedError(
        "backend_agnostic_compile was called inside the scope of a "
        f"{type(current).__name__} over {current.num_replicas_in_sync} replica(s), and "
        f"this process's plan is {plan.strategy}{relocated} over {plan.num_replicas} "
        f"replicas ({plan.reason}). Call it outside any strategy scope (agnostic "
        f"makes the strategy), or in the scope of a {wanted.__name__} over the "
        "plan's devices (agnostic.resolve().devices)."
    )


@contextlib.contextmanager
def central_scope(strategy):
    """The strategy's scope, where layer state updated per step is combined.

    A variable stored once for all devices (or kept the same on every
    device) is updated from every device, so the engine wants to know how to
    combine the updates; Keras 3.13-3.16 say
    "none" for the state a layer updates in its call (batch-normalization
    statistics, dropout seeds). Those are combined as the mean (floats) or
    taken from the first device (integer seeds), as MirroredStrategy does.
    """
    import tensorflow as tf

    def combined(next_creator, **kwargs):
        aggregation = kwargs.get("aggregation")
        if not kwargs.get("trainable", True) and aggregation in (
            None, tf.VariableAggregation.NONE
        ):
            dtype = tf.as_dtype(kwargs.get("dtype") or tf.float32)
            kwargs["aggregation"] = (
                tf.VariableAggregation.MEAN if dtype.is_floating
                else tf.VariableAggregation.ONLY_FIRST_REPLICA
            )
        return next_creator(**kwargs)

    with strategy.scope(), tf.variable_creator_scope(combined):
        yield


_MADE = {}


def made_once(key, make):
    """One strategy per `key` (kind, devices, settings) in a process: a model
    compiled again (fine-tuning) keeps its variables where they are."""
    if key not in _MADE:
        _MADE[key] = make()
    return _MADE[key]
