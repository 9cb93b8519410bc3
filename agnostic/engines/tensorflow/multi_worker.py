"""tf-multi-worker: several processes, each a worker of the engine's
MultiWorkerMirroredStrategy (from TF_CONFIG, made as TensorFlow is imported),
and the places where Keras's fit (3.13-3.16) needs help under it.
"""
import functools
import warnings

from agnostic import collectives, errors
from agnostic.fit import pipeline
from agnostic.compat import tf_worker_logs
from agnostic.engines.tensorflow import distribute, start
from agnostic.strategies import base


class TFMultiWorkerStrategy(base.Strategy):
    name = "tf-multi-worker"

    def compile(self, model, call):
        import tensorflow as tf

        users = distribute.users_strategy(self.plan, tf.distribute.MultiWorkerMirroredStrategy)
        return compile(self.plan, model, call, self.sync_batch_norm, users, self.global_view)


def strategy(plan):
    """The workers' strategy, made when TensorFlow was imported."""
    if "strategy" in start.WORKERS:
        return start.WORKERS["strategy"]
    if "error" in start.WORKERS:
        cause = f"it failed: {start.WORKERS['error']}"
    else:
        cause = ("TensorFlow was imported before agnostic could make it: import "
                 "agnostic before keras in the script, or set AGNOSTIC_JOIN=1 (and "
                 "install keras-agnostic with pip, so that its start-up hook runs)")
    raise errors.LaunchError(
        f"This process is one of {plan.num_processes} TensorFlow workers "
        f"({plan.environment}), which train with MultiWorkerMirroredStrategy; the "
        "engine allows that strategy only before it runs anything, and "
        f"{cause}. Check also that every worker's address is free on its machine."
    )


def compile(plan, model, call, sync_batch_norm=True, users=None, global_view=True):
    """`users`: the program's own MultiWorkerMirroredStrategy, in whose scope
    it compiles; the one agnostic made otherwise. `global_view`: each
    worker's step sees the global batch (agnostic/fit/global_batch.py)."""
    workers = users or strategy(plan)
    _chief_weights(workers, model)
    # Compile sets the steps per execution: bounded right after it.
    call = call.around(after=functools.partial(
        _steps_per_execution, most=plan.steps_per_execution, is_chief=plan.process_id == 0))
    wraps = distribute.distribute(model, workers, workers.scope, call, sync_batch_norm,
                                  global_view)
    wraps += tf_worker_logs.one_value_per_replica(model)
    # TensorFlow gives each worker its part of every batch itself.
    processes = pipeline.Processes(plan.process_id, plan.num_processes,
                                   barrier=lambda: _barrier(workers),
                                   share=collectives.tf_workers_share(workers), shards=False)
    pipeline.wrap(model, plan.num_replicas, processes=processes, even_shares=False,
                  per_replica_calls=True, wraps=wraps)
    return model


def _steps_per_execution(model, most, is_chief):
    """At most `most` steps per call into TensorFlow, as the plan says
    (None: the program's): Keras's loop of several steps in one call
    (`steps_per_execution`, 3.13-3.16) fails under
    MultiWorkerMirroredStrategy, with or without agnostic. The training is
    the same; batch-level callbacks run after every step."""
    steps = getattr(model, "steps_per_execution", 1)
    if most is None or steps <= most:
        return
    model.steps_per_execution = most
    if is_chief:
        warnings.warn(
            f"tf-multi-worker runs {most} training step per call into TensorFlow, "
            f"not steps_per_execution={steps}: Keras's loop of several steps fails "
            "under MultiWorkerMirroredStrategy. The training is the same; callbacks' "
            "on_*_batch_* methods run after every step instead of every "
            f"{steps}th. Compile with steps_per_execution={most} to silence this.",
            errors.StepsPerExecutionWarning, stacklevel=8)  # through the compile call


def _chief_weights(workers, model):
    """Every worker starts from the chief's weights (workers may build their
    models with different random initial values)."""
    import numpy as np
    import tensorflow as tf

    chief = workers.cluster_resolver.task_id == 0  # every process is a worker, rank order
    weights = model.get_weights()

    def value(weight):
        return lambda context: tf.constant(
            weight if chief and context.replica_id_in_sync_group == 0 else np.zeros_like(weight)
        )

    model.set_weights([
        workers.reduce("SUM", workers.experimental_distribute_values_from_function(value(w)),
                       axis=None).numpy()
        for w in weights
    ])


def _barrier(workers):
    """Every worker waits here for the others: a sum across workers."""
    import tensorflow as tf

    ones = workers.experimental_distribute_values_from_function(lambda context: tf.ones(()))
    workers.reduce("SUM", ones, axis=None)
