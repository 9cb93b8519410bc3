"""Batch sizes are global: a batch of B rows is split over the replicas.

Most strategies take batches of any size, exactly as one device does
(TensorFlow's strategies weight each replica's share by its size,
jax-data-parallel in one process lays a batch that does not divide out whole
on every device, torch-ddp weights each process's share). Those that need
equal parts (mxnet-context, JAX over several processes) have every batch
checked here before any work starts.
"""
import inspect
import math

from agnostic import errors

DEFAULT_BATCH_SIZE = 32


def num_samples(data):
    """Samples in arrays (or lists, tuples, dicts of arrays); None otherwise."""
    if isinstance(data, dict):
        data = list(data.values())
    if isinstance(data, (list, tuple)):
        for item in data:
            found = num_samples(item)
            if found is not None:
                return found
        return None
    shape = getattr(data, "shape", None)
    if shape is not None and len(shape) > 0 and isinstance(shape[0], int):
        return int(shape[0])
    return None


def step_data(args, kwargs):
    """The batch a train_step or test_step call was given."""
    return args[0] if args else kwargs.get("data")


def check_split(what, samples, batch_size, num_replicas):
    """Raises BatchSplitError unless every batch splits over the replicas."""
    if samples is None or num_replicas < 2:
        return
    batch_size = batch_size or DEFAULT_BATCH_SIZE
    if batch_size % num_replicas:
        suggestion = max(num_replicas, batch_size - batch_size % num_replicas)
        raise errors.BatchSplitError(
            f"{what}: batch_size={batch_size} is the global batch, split over "
            f"{num_replicas} replicas in equal parts, and {batch_size} is not a "
            f"multiple of {num_replicas}. Pass a multiple of {num_replicas}, such as "
            f"batch_size={suggestion} ({suggestion // num_replicas} per replica)."
        )
    last = samples % batch_size
    if last % num_replicas:
        keep = samples - last % num_replicas
        raise errors.BatchSplitError(
            f"{what}: {samples} samples with batch_size={batch_size} leave a "
            f"last batch of {last} samples ({samples} % {batch_size}), which "
            f"cannot be split evenly over {num_replicas} replicas, and this "
            "strategy splits every batch in equal parts (mxnet-context, JAX "
            "over several processes). Use a number of "
            "samples that is a multiple of "
            f"{num_replicas}, such as {keep} (x[:{keep}], y[:{keep}])."
        )


def pad_for_predict(given, num_replicas):
    """Arrays to predict on, made to split over the replicas: the batch size
    rounded up to a multiple of them and the rows padded with copies of the
    last one, so that every batch splits. Each row's prediction is its own,
    so the padded rows are cut from the result: returns the number of rows
    the caller keeps (None: nothing changed)."""
    x = given.get("x")
    samples = num_samples(x)
    if num_replicas < 2 or not samples or given.get("steps") is not None:
        return None
    batch_size = given.get("batch_size") or DEFAULT_BATCH_SIZE
    batch_size = -(-batch_size // num_replicas) * num_replicas
    padded = -(-samples // num_replicas) * num_replicas
    if padded == samples and batch_size == (given.get("batch_size") or DEFAULT_BATCH_SIZE):
        return None
    given["x"] = _padded(x, padded - samples)
    given["batch_size"] = batch_size
    return samples


def _padded(data, extra):
    import numpy as np

    if isinstance(data, dict):
        return {key: _padded(value, extra) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_padded(value, extra) for value in data)
    if getattr(data, "shape", None) is None or not len(data.shape) or not extra:
        return data
    array = np.asarray(data)
    return np.concatenate([array, np.repeat(array[-1:], extra, axis=0)])


def rows_of(predictions, rows):
    """The first `rows` rows of every array predict returned."""
    if isinstance(predictions, dict):
        return {key: rows_of(value, rows) for key, value in predictions.items()}
    if isinstance(predictions, (list, tuple)):
        return type(predictions)(rows_of(value, rows) for value in predictions)
    return predictions[:rows]


def named_arguments(function, args, kwargs):
    """The call's arguments by name (positional ones too), or None when they
    do not fit `function` (Keras then reports the wrong call itself)."""
    signature = inspect.signature(function)
    try:
        named = dict(signature.bind(*args, **kwargs).arguments)
    except TypeError:
        return None
    for name, parameter in signature.parameters.items():
        if parameter.kind is parameter.VAR_KEYWORD and name in named:
            named.update(named.pop(name))
    return named


def check_call(method, function, num_replicas, args, kwargs):
    """Checks the batches of a fit/evaluate/predict/*_on_batch call."""
    if num_replicas < 2:
        return
    given = named_arguments(function, args, kwargs)
    if given is None:
        return
    x = given.get("x")
    samples = num_samples(x)
    if method.endswith("_on_batch"):
        check_split(method, samples, samples, num_replicas)
        return
    batch_size = given.get("batch_size")
    if method == "fit" and given.get("steps_per_epoch") is None:
        split = given.get("validation_split") or 0.0
        if samples is not None and split:
            train = int(math.floor(samples * (1.0 - split)))  # as Keras cuts it
            check_split("fit (training part of validation_split)", train,
                        batch_size, num_replicas)
            check_split("fit (validation_split part)", samples - train,
                        given.get("validation_batch_size") or batch_size,
                        num_replicas)
        else:
            check_split("fit", samples, batch_size, num_replicas)
        validation = given.get("validation_data")
        if isinstance(validation, (list, tuple)) and validation:
            check_split("fit (validation_data)", num_samples(validation[0]),
                        given.get("validation_batch_size") or batch_size,
                        num_replicas)
    elif given.get("steps") is None:
        check_split(method, samples, batch_size, num_replicas)
