"""TensorFlow's replication, as the plan names it:

- tf-mirrored: tf.distribute.MirroredStrategy over the plan's devices;
- tf-central-storage (cpu_relocation=True): the variables live once, on the
  CPU, and the devices compute (the engine's CentralStorageStrategy): the
  legacy multi_gpu_model kept the template's weights on the CPU the same way;
- tf-multi-worker: several processes, each a worker of
  MultiWorkerMirroredStrategy (see tf_workers).
"""
import contextlib
import itertools
import logging

from agnostic import errors, pipeline, plan as plan_lib
from agnostic.compat import tf_central_metrics, tf_collective_keys
from agnostic.strategies import base, tf_distribute, tf_workers

LOGGER = logging.getLogger("agnostic")
_STRATEGIES_MADE = itertools.count(1)
_MADE = {}


class TFMirroredStrategy(base.Strategy):
    name = "tf-mirrored"

    def distribution(self):
        import tensorflow as tf

        if self.plan.strategy == plan_lib.TF_CENTRAL_STORAGE:
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

    def compile(self, model, call):
        users = users_strategy(self.plan)
        if self.plan.strategy == plan_lib.TF_MULTI_WORKER:
            return tf_workers.compile(self.plan, model, call, self.sync_batch_norm, users)
        central = self.plan.strategy == plan_lib.TF_CENTRAL_STORAGE
        strategy = users or self._made_once()
        if central:
            LOGGER.info(
                "cpu_relocation=True: the variables live once on /cpu:0 and %d "
                "devices compute; their gradients are summed there%s.",
                self.plan.num_replicas,
                "" if self.cpu_merge else " (cpu_merge=False has no effect with it)",
            )
        # Per-replica statistics (and variables stored once) combine the
        # updates a layer makes in its call.
        scope = strategy.scope
        if central or not self.sync_batch_norm:
            def scope():
                return _central_scope(strategy)
        tf_distribute.distribute(model, strategy, scope, call, self.sync_batch_norm)
        if central:
            tf_central_metrics.update_in_place(model)
        pipeline.wrap(model, self.plan.num_replicas, even_shares=False)
        return model

    def _made_once(self):
        """One strategy per kind and devices in a process: a model compiled
        again (fine-tuning) keeps its variables where they are."""
        key = (self.plan.strategy, self.plan.devices, self.cpu_merge)
        if key not in _MADE:
            _MADE[key] = self.distribution()
        return _MADE[key]


def users_strategy(plan):
    """The tf.distribute strategy in whose scope the program compiles, when
    it is the kind the plan makes, over as many replicas (Ray's and
    TensorFlow's guides make a MultiWorkerMirroredStrategy in the training
    function): agnostic trains under it rather than beside it. None outside
    any scope; another kind is an error, before anything is built."""
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return None
    current = tf.distribute.get_strategy()
    if plan.strategy == plan_lib.TF_MULTI_WORKER:
        wanted = tf.distribute.MultiWorkerMirroredStrategy
    else:
        wanted = tf.distribute.MirroredStrategy
    central = plan.strategy == plan_lib.TF_CENTRAL_STORAGE
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
