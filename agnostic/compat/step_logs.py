"""A step of the program's own that returns its metrics' results as the
Keras guide writes it, `{m.name: m.result() for m in self.metrics}`, nests
the compiled metrics' results in one dict ("compile_metrics"). Keras reads
the metrics themselves at an epoch's end only where a step's logs have the
keys of `get_metrics_result()` (Model._get_metrics_result_or_logs); else
the history is the last step's logs: under a tf.distribute strategy the mean
of each replica's own results, on torch each process's own. With each nested
result in its place the logs have Keras's keys (as its callbacks get them,
through pythonify_logs), and the history is every replica's (Keras 3.13-3.16).
"""
from agnostic.compat import versions

STEPS = ("train_step", "test_step")


def probe(keras):
    """Keras reads the metrics where a step's logs have their keys."""
    import inspect

    method = getattr(keras.Model, "_get_metrics_result_or_logs", None)
    versions.expect(callable(method), "keras.Model._get_metrics_result_or_logs (its "
                    "trainer's, Trainer or BaseTrainer by version)")
    source = inspect.getsource(method)
    versions.expect("self.get_metrics_result()" in source and "set(logs.keys())" in source,
                    "Model._get_metrics_result_or_logs returning get_metrics_result() "
                    "where a step's logs have its keys")


def in_place(logs, model):
    """`logs` with each value that is the dict result of one of `model`'s
    metrics (by its name) replaced by that dict's entries."""
    names = {metric.name for metric in model.metrics}
    flat = {}
    for key, value in logs.items():
        if isinstance(value, dict) and key in names:
            flat.update(value)
        else:
            flat[key] = value
    return flat


def metrics_in_place(model, summed=True):
    """TensorFlow: `model`'s train_step and test_step return their logs
    `in_place`, each metric's result over every replica's
    samples (`summed`: its variables summed across the replicas, as reading them
    across replicas does), so that what a step reports after each batch
    (the progress bar, the callbacks) is one device's too, and not the mean
    of each replica's own results. Not `summed`: each replica's metrics hold
    the whole batch's already (agnostic/fit/global_batch.py). Returns the
    wraps, for methods.wrap_all."""
    def wrapper(step):
        def run(*args, **kwargs):
            logs = step(*args, **kwargs)
            if not isinstance(logs, dict):
                return logs
            logs = in_place(logs, model)
            every = _over_replicas(model) if summed else {}
            return {key: every.get(key, value) for key, value in logs.items()}

        return run

    return [(model, name, wrapper) for name in STEPS]


def _over_replicas(model):
    """Each metric's result from its variables summed across the replicas
    in sync, every metric's in one all-reduce (none: {})."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return {}
    metrics = [metric for metric in model.metrics if metric.variables]
    # Read into tensors first: given the variables themselves, TensorFlow
    # takes each as its own destination, which fails under
    # MultiWorkerMirroredStrategy ("destinations can not be empty").
    values = [tf.identity(variable.value) for metric in metrics for variable in metric.variables]
    summed = context.all_reduce(tf.distribute.ReduceOp.SUM, values) if values else []
    results, start = {}, 0
    for metric in metrics:
        end = start + len(metric.variables)
        result = metric.stateless_result(summed[start:end])
        results.update(result if isinstance(result, dict) else {metric.name: result})
        start = end
    return results
