"""jax-data-parallel: keras.distribution.DataParallel over the plan's devices.

With several processes (agnostic launch, or Keras's distribution variables),
the devices are every process's: each process feeds its own part of every
global batch, and JAX's one program computes on the whole batch.
"""
import contextlib

from agnostic import collectives, in_place, methods, pipeline
from agnostic.compat import jax_uneven_batches, keras_variables
from agnostic.strategies import base


class JaxDataParallelStrategy(base.Strategy):
    name = "jax-data-parallel"

    def compile(self, model, call):
        import keras

        plan = self.plan
        if plan.num_processes > 1:
            _same_weights_everywhere(model)
        # agnostic gives each process its own shard (Keras would shard only
        # tf.data datasets), so Keras is told the data is already sharded.
        distribution = keras.distribution.DataParallel(
            devices=list(plan.devices), auto_shard_dataset=plan.num_processes == 1
        )
        in_place.compile_in(model, distribution.scope(), call)
        # Keras shards each batch by the distribution active at call time, so
        # each call runs under this model's own one (several may coexist).
        if plan.num_processes == 1:  # batches of any size (compat.jax_uneven_batches)
            pipeline.wrap(model, plan.num_replicas,
                          scope=jax_uneven_batches.allow(distribution), even_shares=False)
            return model
        processes = pipeline.Processes(plan.process_id, plan.num_processes,
                                       barrier=_barrier, share=collectives.jax_share)
        pipeline.wrap(model, plan.num_replicas, scope=distribution.scope,
                      processes=processes, predict_scope=lambda: _locally(model))
        _save_outside_the_mesh(model)
        return model


def _save_outside_the_mesh(model):
    """The chief saves alone, so nothing in a save may wait for the others.

    Keras's save makes a throwaway optimizer, whose variable, made under the
    active distribution, is placed on every process's devices: a step all
    processes must take together. Callbacks (ModelCheckpoint,
    BackupAndRestore) save inside fit, under the model's distribution, so
    saves run with no distribution active; the weights read the same.
    """
    import keras

    def wrap(original):
        def run(*args, **kwargs):
            active = keras.distribution.distribution()
            keras.distribution.set_distribution(None)
            try:
                return original(*args, **kwargs)
            finally:
                keras.distribution.set_distribution(active)

        return run

    for name in ("save", "save_weights", "export"):
        if hasattr(model, name):
            methods.wrap_method(model, name, wrap)


@contextlib.contextmanager
def _locally(model):
    """Each process predicts every sample on its own devices: a prediction
    spread over several processes' devices cannot be read back as one
    array. The model's variables hold this process's copy meanwhile."""
    import keras

    active = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        with keras_variables.local_values(model.variables):
            yield
    finally:
        keras.distribution.set_distribution(active)


def _barrier():
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("agnostic: a file was saved")


def _same_weights_everywhere(model):
    from jax.experimental import multihost_utils

    weights = multihost_utils.broadcast_one_to_all(model.get_weights())
    model.set_weights([w for w in weights])
