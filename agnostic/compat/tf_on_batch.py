"""TensorFlow: `train_on_batch`, `test_on_batch` and `predict_on_batch` split
their one batch over the replicas, as `fit` and `evaluate` do.

Keras 3.13-3.16 hand that batch to the strategy whole (`train_function`,
`test_function` get a Python generator of it, `predict_function` a list), so
every replica computes all of it: `predict_on_batch` returns every sample
once per replica (32 rows for a batch of 16 on 2 replicas), the metrics'
state (summed over the replicas when read) counts every sample once per
replica, and the work is done N times. The step functions the model makes
are given the batch split into one part per replica instead, and the train
and test steps then report the metrics' results over all replicas (Keras
reports the first replica's logs, which were the whole batch's only because
it computed the whole batch). What `fit`, `evaluate` and `predict` pass them
(the strategy's own iterators and values) goes through unchanged.
"""
from agnostic.compat import versions

FUNCTIONS = {"make_train_function": "train_function",
             "make_test_function": "test_function",
             "make_predict_function": "predict_function"}


def split_batches(model, strategy):
    """Every step function `model` makes splits a whole batch it is given."""
    return [(model, maker, _splitting_after(model, attribute, strategy))
            for maker, attribute in FUNCTIONS.items()]


def probe(keras):
    """What the splitting relies on (agnostic/compat/registry.py): each
    `make_*_function` of a compiled model leaves the function it made in its
    attribute, where `split_batches` replaces it (run here on a 1-layer
    model, under TensorFlow's default strategy)."""
    import tensorflow as tf

    model = keras.Sequential([keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd")
    from agnostic import methods

    methods.wrap_all(split_batches(model, tf.distribute.get_strategy()))
    for maker, attribute in FUNCTIONS.items():
        getattr(model, maker)()
        versions.expect(getattr(getattr(model, attribute), "splits_batches", False),
                        f"Model.{maker} leaving what it made in Model.{attribute}")
    versions.expect(callable(getattr(model, "get_metrics_result", None)),
                    "Model.get_metrics_result")


def _splitting_after(model, attribute, strategy):
    def wrapper(make):
        def run(*args, **kwargs):
            make(*args, **kwargs)
            function = getattr(model, attribute, None)
            if function is None:
                raise versions.moved(f"Model.{attribute}")
            if not getattr(function, "splits_batches", False):
                results = None if attribute == "predict_function" else model.get_metrics_result
                setattr(model, attribute, _splitting(function, strategy, results))
            return getattr(model, attribute)

        return run

    return wrapper


def _splitting(function, strategy, results=None):
    """`function`, splitting a whole batch; `results`: what a train or test
    step on one then reports (the metrics over every replica)."""
    import tensorflow as tf

    def run(data):
        if isinstance(data, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            return function(data)  # fit's, evaluate's: the strategy's own
        if isinstance(data, list):  # predict's steps, or predict_on_batch's batch
            return function([step if _distributed(step) else _split(step, strategy)
                             for step in data])
        logs = function(_split(batch, strategy) for batch in data)
        return results() if results is not None else logs

    run.splits_batches = True
    return run


def _distributed(values):
    import tensorflow as tf

    return any(isinstance(value, tf.distribute.DistributedValues)
               for value in tf.nest.flatten(values))


def _split(batch, strategy):
    """`batch` as per-replica values: replica i gets the i-th of N parts of
    every array in it, in order, the first B % N parts one row larger (as
    tf.distribute splits a batch), so that any batch size splits."""
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync

    def part(context):
        index = context.replica_id_in_sync_group

        def take(value):
            if value is None:
                return None
            value = tf.convert_to_tensor(value)
            size, extra = divmod(value.shape[0], replicas)
            start = index * size + min(index, extra)
            return value[start:start + size + (1 if index < extra else 0)]

        return tf.nest.map_structure(take, batch)

    return strategy.experimental_distribute_values_from_function(part)
