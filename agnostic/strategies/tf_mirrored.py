"""tf-mirrored: tf.distribute.MirroredStrategy over the plan's devices."""
from agnostic.strategies import base


class TFMirroredStrategy(base.Strategy):
    name = "tf-mirrored"

    def distribution(self):
        import tensorflow as tf

        if self.cpu_merge:
            # The legacy multi_gpu_model merged the replicas' results on the CPU.
            reduce = tf.distribute.ReductionToOneDevice(reduce_to_device="/cpu:0")
        else:
            reduce = None  # the engine picks: NCCL all-reduce on GPUs
        return tf.distribute.MirroredStrategy(
            devices=list(self.plan.devices), cross_device_ops=reduce
        )

    def compile(self, template, compile_kwargs):
        import tensorflow as tf

        strategy = self.distribution()
        scope = strategy.scope()
        if self.cpu_relocation:
            scope = _Both(tf.device("/cpu:0"), scope)
        model = base.build_replica_model(template, scope, compile_kwargs)
        base.keep_template_in_sync(model, template, self.plan.num_replicas)
        return model


class _Both:
    def __init__(self, outer, inner):
        self.outer, self.inner = outer, inner

    def __enter__(self):
        self.outer.__enter__()
        return self.inner.__enter__()

    def __exit__(self, *exc):
        try:
            return self.inner.__exit__(*exc)
        finally:
            self.outer.__exit__(*exc)
