"""tf-mirrored: tf.distribute.MirroredStrategy over the plan's devices."""
from agnostic import errors
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
        if self.plan.num_processes > 1:
            raise errors.NotSupportedError(
                f"TF_CONFIG asks for {self.plan.num_processes} TensorFlow workers, but "
                "Keras 3.15 cannot train under MultiWorkerMirroredStrategy: its "
                "fit reduces per-replica values across workers in ways the "
                "strategy refuses (building the model from a first batch, and "
                "the metrics of every step). Nothing was trained. For several "
                "machines use KERAS_BACKEND=jax or torch with the same script "
                "and `agnostic launch`."
            )
        # cpu_relocation needs nothing here: the replicas are built from the
        # template inside the strategy, which keeps one copy per device.
        model = base.build_replica_model(template, self.distribution().scope(), compile_kwargs)
        base.wrap_returned_model(model, template, self.plan.num_replicas)
        return model
