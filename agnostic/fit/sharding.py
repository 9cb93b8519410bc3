"""Each process of a multi-process strategy trains on its own shard.

Global batch k holds samples [k*B, (k+1)*B). Process r of N takes the r-th
part of every global batch, so that N processes see exactly the batches one
device would. A batch of any size is split as tf.distribute splits it: the
first `size % N` processes take one row more (33 rows over 2: 17 and 16; one
row over 2: 1 and none); where the strategy weights each share by its size
(torch-ddp), the N processes then average one device's gradients.
"""
import inspect
import math
import sys

import numpy as np

from agnostic import batching, errors
from agnostic.compat import shuffle_order


def share(size, rank, world_size):
    """(start, stop): process `rank`'s rows of a batch of `size` rows."""
    base, extra = divmod(size, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def splits_evenly(samples, batch_size, world_size):
    """Whether every batch of `samples` rows in batches of `batch_size`
    gives every process the same number of rows."""
    return batch_size % world_size == 0 and samples % batch_size % world_size == 0


def shard_indices(num_samples, batch_size, rank, world_size):
    """The sample indices of process `rank`, batch by batch."""
    pieces = []
    for start in range(0, num_samples, batch_size):
        low, high = share(min(batch_size, num_samples - start), rank, world_size)
        pieces.append(np.arange(start + low, start + high))
    return np.concatenate(pieces) if pieces else np.arange(0)


def take(data, indices):
    """`data` (an array, or lists, tuples, dicts of them) at `indices`."""
    if data is None:
        return None
    if isinstance(data, dict):
        return {key: take(value, indices) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(take(value, indices) for value in data)
    return np.asarray(data)[indices]


def part_of(batch, rank, world_size):
    """Process `rank`'s part of one batch (arrays or tensors, or lists,
    tuples and dicts of them), of the batch's own kind."""
    size = batching.num_samples(batch[0] if isinstance(batch, (tuple, list)) else batch)
    return rows(batch, *share(size, rank, world_size))


def rows(data, start, stop):
    """Rows [start, stop) of `data` (arrays or tensors, or lists, tuples,
    dicts of them), each of its own kind."""
    if data is None:
        return None
    if isinstance(data, dict):
        return {key: rows(value, start, stop) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(rows(value, start, stop) for value in data)
    return data[start:stop]


def take_part(given, names, rank, world_size):
    """Process `rank`'s part of one batch, for each of `names` in `given`."""
    for name in names:
        if given.get(name) is not None:
            given[name] = part_of(given[name], rank, world_size)


def shard(what, x, others, batch_size, rank, world_size):
    """Process `rank`'s shard of x and of each of `others` (y, sample_weight).

    Raises UnsupportedInputError for inputs whose samples cannot be counted.
    """
    samples = batching.num_samples(x)
    if samples is None:
        raise errors.UnsupportedInputError(
            f"{what}: with several processes agnostic gives each process its "
            "own shard of the data, and it can split NumPy arrays (or lists, "
            "tuples and dicts of them), a keras.utils.PyDataset, a Python "
            "generator of batches, a tf.data.Dataset and a torch DataLoader. "
            f"Received: x of type {type(x).__name__}. "
            "Pass arrays (x=np.asarray(...)), or wrap your batches in a "
            "keras.utils.PyDataset."
        )
    indices = shard_indices(samples, batch_size, rank, world_size)
    return take(x, indices), [take(other, indices) for other in others]


def _sharded_class():
    import keras

    class ShardedPyDataset(keras.utils.PyDataset):
        """The user's dataset, with its workers, multiprocessing and queue."""

        def __init__(self, dataset, rank, world_size):
            super().__init__(workers=getattr(dataset, "workers", 1),
                             use_multiprocessing=getattr(dataset, "use_multiprocessing", False),
                             max_queue_size=getattr(dataset, "max_queue_size", 10))
            self.dataset, self.rank, self.world_size = dataset, rank, world_size

        def __len__(self):
            return len(self.dataset)

        def __getitem__(self, index):
            return part_of(self.dataset[index], self.rank, self.world_size)

        def on_epoch_end(self):
            self.dataset.on_epoch_end()

    return ShardedPyDataset


def is_dataset(data):
    import keras

    return isinstance(data, keras.utils.PyDataset)


def is_generator(data):
    """A Python generator or other one-pass iterator of batches."""
    return inspect.isgenerator(data) or (
        hasattr(data, "__next__") and hasattr(data, "__iter__")
        and batching.num_samples(data) is None
    )


def batch_parts(arrays, batch_size, rank, world_size, shuffle=False):
    """Arrays as a PyDataset whose batch i is process `rank`'s part of global
    batch i (of any size). `shuffle`: fit(shuffle=True), each epoch one order
    over every sample, drawn as one device draws it (Keras would shuffle each
    process's shard instead)."""
    import keras

    samples = batching.num_samples(arrays[0])

    class BatchParts(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.order = None
            self.epoch = 0  # within this fit call

        def __len__(self):
            return math.ceil(samples / batch_size)

        def __getitem__(self, index):
            if self.order is None:  # as the epoch starts, as Keras draws it
                self.order = (shuffle_order.permutation(samples, self.epoch) if shuffle
                              else np.arange(samples))
            batch = self.order[index * batch_size:(index + 1) * batch_size]
            return take(arrays, batch[slice(*share(len(batch), rank, world_size))])

        def on_epoch_end(self):
            self.order = None
            self.epoch += 1

    return BatchParts()


def split_validation(x, y, kwargs, split):
    """validation_split, done before sharding as Keras does it on one device."""

    samples = batching.num_samples(x)
    cut = int(math.floor(samples * (1.0 - split)))  # as Keras cuts it
    head, tail = range(0, cut), range(cut, samples)
    weights = kwargs.get("sample_weight")
    validation = (take(x, list(tail)), take(y, list(tail)))
    if weights is not None:
        validation += (take(weights, list(tail)),)
        kwargs["sample_weight"] = take(weights, list(head))
    return take(x, list(head)), take(y, list(head)), validation


def shard_batched(data, rank, world, even=False):
    """Process `rank`'s part of each batch of `data`, where its batches come
    made (a PyDataset, a generator, a tf.data.Dataset, a torch DataLoader),
    of the same kind; None for other data. `even`: the strategy needs equal
    parts, checked before any work on a PyDataset's first and last batches,
    and on each batch a generator yields (every process runs the same
    generator and keeps its share of every global batch)."""
    def check(what, batch):
        if even:
            size = batching.num_samples(batch[0] if isinstance(batch, tuple) else batch)
            batching.check_split(what, size, size, world)

    def parts(batches):
        for index, batch in enumerate(batches):
            check(f"generator batch {index}", batch)
            yield part_of(batch, rank, world)

    if is_dataset(data):
        for index in sorted({0, len(data) - 1}):
            check(f"PyDataset batch {index}", data[index])
        return _sharded_class()(data, rank, world)
    if _is_tf_dataset(data):
        return _shard_tf_dataset(data, rank, world)
    if _is_torch_loader(data):
        return _shard_torch_loader(data, rank, world)
    if is_generator(data):
        return parts(data)
    return None


def _is_tf_dataset(data):
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(data, tf.data.Dataset)


def _is_torch_loader(data):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(data, torch.utils.data.DataLoader)


def _shard_tf_dataset(dataset, rank, world):
    """The dataset with each batch cut to process `rank`'s part (keras.io's
    timeseries example builds one with timeseries_dataset_from_array)."""
    import tensorflow as tf

    def part(*batch):
        batch = batch[0] if len(batch) == 1 else batch
        size = tf.shape(tf.nest.flatten(batch)[0])[0]
        base, extra = size // world, size % world
        start = rank * base + tf.minimum(rank, extra)
        stop = start + base + tf.cast(rank < extra, size.dtype)
        return tf.nest.map_structure(lambda value: value[start:stop], batch)

    return dataset.map(part)


def _shard_torch_loader(loader, rank, world):
    """A DataLoader giving process `rank`'s part of each of `loader`'s
    batches, epoch after epoch (keras.io's GAN on torch feeds one)."""
    import torch

    class Parts(torch.utils.data.IterableDataset):
        def __iter__(self):
            for batch in loader:
                yield part_of(batch, rank, world)

        def __len__(self):
            return len(loader)

    return torch.utils.data.DataLoader(Parts(), batch_size=None)


def shard_inputs(what, x, y, given, rank, world, even=False):
    """This process's shard of x, y and sample_weight; sets its batch size.
    `even`: the strategy needs every process's part of a batch to be the
    same size (checked before, for arrays)."""
    batches = shard_batched(x, rank, world, even)
    if batches is not None:  # batches come made
        return batches, y, given
    batch_size = given.get("batch_size") or batching.DEFAULT_BATCH_SIZE
    weights = given.get("sample_weight")
    samples = batching.num_samples(x)
    shuffle = what == "fit" and given.get("shuffle", True) is True
    if samples and (shuffle or not splits_evenly(samples, batch_size, world)):
        arrays = (x, y, weights)
        while arrays[-1] is None:  # as Keras's batches: (x,), (x, y) or (x, y, weights)
            arrays = arrays[:-1]
        given.pop("batch_size", None)
        given.pop("sample_weight", None)
        if what == "fit":  # the order is drawn above, for every process alike
            given["shuffle"] = False
        return batch_parts(arrays, batch_size, rank, world, shuffle), None, given
    x, (y, weights) = shard(what, x, [y, weights], batch_size, rank, world)
    if weights is not None:
        given["sample_weight"] = weights
    given["batch_size"] = batch_size // world
    return x, y, given


def take_share(method, given, rank, world, even=False):
    """Process `rank`'s part of the data a call of `method` (fit, evaluate,
    *_on_batch) was given, in `given` (its arguments by name): step 2 of
    the fit wrapper (agnostic/fit/pipeline.py). `even`: the strategy needs
    equal parts."""
    if method == "fit":
        _shard_fit(given, rank, world, even)
    elif method.endswith("_on_batch"):
        take_part(given, ("x", "y", "sample_weight"), rank, world)
    else:
        x, y = given.pop("x", None), given.pop("y", None)
        given["x"], given["y"], _ = shard_inputs(method, x, y, given, rank, world, even)


def _shard_fit(given, rank, world, even):
    """fit's: validation_split cut before sharding, as one device cuts it,
    then this process's part of the training and validation data."""
    x, y = given.pop("x", None), given.pop("y", None)
    split = given.pop("validation_split", 0.0) or 0.0
    if split and batching.num_samples(x) is not None:
        x, y, given["validation_data"] = split_validation(x, y, given, split)
    batch_size = given.get("batch_size") or batching.DEFAULT_BATCH_SIZE
    given["x"], given["y"], _ = shard_inputs("fit", x, y, given, rank, world, even)
    validation = given.pop("validation_data", None)
    if isinstance(validation, (list, tuple)) and validation:
        x, y, weights = (tuple(validation) + (None, None))[:3]
        part = {"batch_size": given.pop("validation_batch_size", None) or batch_size,
                "sample_weight": weights}
        x, y, part = shard_inputs("fit (validation_data)", x, y, part, rank, world, even)
        validation = x if is_dataset(x) else (x, y) if part.get("sample_weight") is None \
            else (x, y, part["sample_weight"])
        if "batch_size" in part:
            given["validation_batch_size"] = part["batch_size"]
    elif validation is not None:  # batches that come made: a PyDataset, a tf.data.Dataset...
        sharded = shard_batched(validation, rank, world, even)
        validation = validation if sharded is None else sharded
    if validation is not None:
        given["validation_data"] = validation
