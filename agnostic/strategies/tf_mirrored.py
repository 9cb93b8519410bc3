"""tf-mirrored: tf.distribute.MirroredStrategy over the plan's devices
(several workers: see tf_workers).

With cpu_relocation=True the variables live once, on the CPU, and the
devices compute (the engine's CentralStorageStrategy): the legacy
multi_gpu_model kept the template's weights on the CPU the same way.
"""
import contextlib
import itertools
import logging

from agnostic import batch_norm, errors
from agnostic.compat import tf_collective_keys, tf_first_batch, tf_on_batch
from agnostic.strategies import base, tf_workers

LOGGER = logging.getLogger("agnostic")
_STRATEGIES_MADE = itertools.count(1)


class TFMirroredStrategy(base.Strategy):
    name = "tf-mirrored"

    def distribution(self):
        import tensorflow as tf

        if self.cpu_relocation:
            return tf.distribute.experimental.CentralStorageStrategy(
                compute_devices=list(self.plan.devices), parameter_device="/cpu:0"
            )
        if self.cpu_merge:
            # The legacy multi_gpu_model merged the replicas' results on the CPU.
            reduce = tf.distribute.ReductionToOneDevice(reduce_to_device="/cpu:0")
        else:
            reduce = None  # the engine picks: NCCL all-reduce on GPUs
        # The engine's all-reduce numbers its device groups from 1 in every
        # MirroredStrategy, and the runtime remembers a group's size for the
        # whole process: a model on 4 devices made after one on 2 would
        # fail mid-step ("joining a group with size 4, but that group has
        # size 2"). Each strategy gets its own range of numbers (the
        # engine's tests do the same through this attribute).
        return tf_collective_keys.mirrored_strategy(self.plan.devices, reduce,
                                                    10000 * next(_STRATEGIES_MADE))

    def compile(self, template, compile_kwargs):
        # Batch statistics over the global batch: Keras's own synchronised
        # batch normalization in the replica model (the template keeps its
        # layers as they are).
        clone = batch_norm.synchronized_clone if self.sync_batch_norm else None
        users = users_strategy(self.plan, self.cpu_relocation)
        if self.plan.num_processes > 1:  # cpu_relocation: compile warns
            return tf_workers.compile(self.plan, template, compile_kwargs, clone, users)
        strategy = users or self.distribution()
        if not self.cpu_relocation:
            # Per-replica statistics: the moving ones are still averaged.
            scope = strategy.scope() if self.sync_batch_norm else _central_scope(strategy)
            model = base.build_replica_model(template, scope, compile_kwargs, clone)
            tf_first_batch.build_without_reading(model, strategy)
            tf_on_batch.split_batches(model, strategy)
            base.wrap_returned_model(model, template, self.plan.num_replicas)
            return model
        LOGGER.info(
            "cpu_relocation=True: the variables live once on /cpu:0 and %d "
            "devices compute; their gradients are summed there%s.",
            self.plan.num_replicas,
            "" if self.cpu_merge else " (cpu_merge=False has no effect with it)",
        )
        model = base.build_replica_model(template, _central_scope(strategy), compile_kwargs,
                                         clone)
        tf_first_batch.build_without_reading(model, strategy)
        tf_on_batch.split_batches(model, strategy)
        _update_metrics_in_place(model)
        base.wrap_returned_model(model, template, self.plan.num_replicas)
        return model


def users_strategy(plan, cpu_relocation=False):
    """The tf.distribute strategy in whose scope the program compiles, when
    it is the kind the plan makes, over as many replicas (Ray's and
    TensorFlow's guides make a MultiWorkerMirroredStrategy in the training
    function): agnostic trains under it rather than beside it. None outside
    any scope; another kind is an error, before anything is built."""
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return None
    current = tf.distribute.get_strategy()
    if plan.num_processes > 1:
        wanted = tf.distribute.MultiWorkerMirroredStrategy
    else:
        wanted = tf.distribute.MirroredStrategy
    central = cpu_relocation and plan.num_processes == 1  # a CentralStorageStrategy
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
def _central_scope(strategy):
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


def _update_metrics_in_place(model):
    """Metric totals add each device's part once.

    Keras 3.13-3.16 add to a variable by assigning `value + delta`
    (`assign_add`, and metrics such as Precision, AUC, TruePositives call
    `assign(variable + delta)` themselves); on a variable stored once and
    summed over the devices, every step would then add the old total once
    per device (measured: counts 240 instead of 64 over one epoch on 2
    devices). Metric variables exist once the step functions are made (Keras
    builds the metrics from a first batch), so before that, each one is
    given the engine's own in-place add, and in a step an `assign` adds its
    difference from the stored value.
    """
    def before(original):
        def run(*args, **kwargs):
            for variable in model.metrics_variables:
                if "assign_add" not in vars(variable):
                    variable.assign_add = _in_place(variable, "assign_add")
                    variable.assign_sub = _in_place(variable, "assign_sub")
                    variable.assign = _assigned_as_added(variable)
            return original(*args, **kwargs)

        return run

    for name in ("make_train_function", "make_test_function"):
        base.wrap_method(model, name, before)


def _in_place(variable, name):
    import tensorflow as tf

    stored = variable.value  # the engine's variable, on the CPU

    def update(delta):
        return getattr(stored, name)(tf.cast(delta, stored.dtype))

    return update


def _assigned_as_added(variable):
    """`assign(new)` in a replica's step: adds `new - stored`, which the
    engine sums over the replicas once; elsewhere (a reset) an assignment."""
    import tensorflow as tf

    stored = variable.value
    assign = variable.assign

    def update(value):
        if tf.distribute.in_cross_replica_context():
            return assign(value)
        value = tf.cast(value, stored.dtype)
        return stored.assign_add(value - tf.identity(stored))

    return update
