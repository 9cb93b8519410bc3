"""tf-central-storage (cpu_relocation=True): the variables live once, on the
CPU, and the plan's devices compute (the engine's CentralStorageStrategy):
the legacy multi_gpu_model kept the template's weights on the CPU the same
way."""
import logging

from agnostic.fit import pipeline
from agnostic.compat import tf_central_metrics
from agnostic.engines.tensorflow import distribute
from agnostic.strategies import base

LOGGER = logging.getLogger("agnostic")


class TFCentralStorageStrategy(base.Strategy):
    name = "tf-central-storage"

    def distribution(self):
        import tensorflow as tf

        return tf.distribute.experimental.CentralStorageStrategy(
            compute_devices=list(self.plan.devices), parameter_device="/cpu:0"
        )

    def compile(self, model, call):
        import tensorflow as tf

        distribute.users_strategy(self.plan, tf.distribute.MirroredStrategy, central=True)
        strategy = distribute.made_once((self.name, self.plan.devices), self.distribution)
        LOGGER.info(
            "cpu_relocation=True: the variables live once on /cpu:0 and %d "
            "devices compute; their gradients are summed there%s.",
            self.plan.num_replicas,
            "" if self.cpu_merge else " (cpu_merge=False has no effect with it)",
        )

        # Variables stored once combine the updates a layer makes in its call.
        def scope():
            return distribute.central_scope(strategy)

        wraps = distribute.distribute(model, strategy, scope, call, self.sync_batch_norm,
                                      self.global_view)
        wraps += tf_central_metrics.update_in_place(model)
        pipeline.wrap(model, self.plan.num_replicas, even_shares=False, per_replica_calls=True,
                      wraps=wraps)
        return model
