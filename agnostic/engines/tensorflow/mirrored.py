"""tf-mirrored: tf.distribute.MirroredStrategy over the plan's devices (with
the legacy "CPU merge": the replicas' results combined on the CPU)."""
import itertools

from agnostic.fit import pipeline
from agnostic.compat import tf_collective_keys
from agnostic.engines.tensorflow import distribute
from agnostic.strategies import base

_STRATEGIES_MADE = itertools.count(1)


class TFMirroredStrategy(base.Strategy):
    name = "tf-mirrored"

    def distribution(self):
        import tensorflow as tf

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
        import tensorflow as tf

        strategy = distribute.users_strategy(self.plan, tf.distribute.MirroredStrategy) \
            or distribute.made_once((self.name, self.plan.devices, self.cpu_merge),
                                       self.distribution)
        # Per-replica statistics combine the updates a layer makes in its call.
        scope = strategy.scope
        if not self.sync_batch_norm:
            def scope():
                return distribute.central_scope(strategy)
        wraps = distribute.distribute(model, strategy, scope, call, self.sync_batch_norm,
                                      self.global_view)
        pipeline.wrap(model, self.plan.num_replicas, even_shares=False, per_replica_calls=True,
                      wraps=wraps)
        return model
