"""jax-data-parallel: keras.distribution.DataParallel over the plan's devices."""
from agnostic.strategies import base


class JaxDataParallelStrategy(base.Strategy):
    name = "jax-data-parallel"

    def compile(self, template, compile_kwargs):
        import keras

        distribution = keras.distribution.DataParallel(devices=list(self.plan.devices))
        model = base.build_replica_model(template, distribution.scope(), compile_kwargs)
        # Keras shards each batch by the distribution active at call time, so
        # each call runs under this model's own one (several may coexist).
        base.wrap_returned_model(
            model, template, self.plan.num_replicas, scope_factory=distribution.scope
        )
        return model
