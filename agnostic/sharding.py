"""Each process of a multi-process strategy trains on its own shard.

Global batch k holds samples [k*B, (k+1)*B). Process r of N takes the r-th
N-th of every global batch, so that N processes see exactly the batches one
device would, and average the same gradients.
"""
import numpy as np

from agnostic import batching, errors


def shard_indices(num_samples, batch_size, rank, world_size):
    """The sample indices of process `rank`, batch by batch."""
    pieces = []
    for start in range(0, num_samples, batch_size):
        local = min(batch_size, num_samples - start) // world_size
        pieces.append(np.arange(start + rank * local, start + (rank + 1) * local))
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


def shard(what, x, others, batch_size, rank, world_size):
    """Process `rank`'s shard of x and of each of `others` (y, sample_weight).

    Raises UnsupportedInputError for inputs whose samples cannot be counted.
    """
    samples = batching.num_samples(x)
    if samples is None:
        raise errors.UnsupportedInputError(
            f"{what}: with several processes agnostic gives each process its "
            "own shard of the data, and it can split NumPy arrays (or lists, "
            "tuples and dicts of them). Received: x of type "
            f"{type(x).__name__}. Pass arrays, e.g. x=np.asarray(...)."
        )
    indices = shard_indices(samples, batch_size, rank, world_size)
    return take(x, indices), [take(other, indices) for other in others]


def shard_py_dataset(dataset, rank, world_size):
    """A PyDataset whose batch i is process `rank`'s part of `dataset[i]`."""
    import keras

    for index in {0, len(dataset) - 1}:
        first = dataset[index]
        size = batching.num_samples(first[0] if isinstance(first, tuple) else first)
        batching.check_split(f"PyDataset batch {index}", size, size, world_size)

    class ShardedPyDataset(keras.utils.PyDataset):
        def __len__(self):
            return len(dataset)

        def __getitem__(self, index):
            batch = dataset[index]
            size = batching.num_samples(batch[0] if isinstance(batch, tuple) else batch)
            local = size // world_size
            return take(batch, np.arange(rank * local, (rank + 1) * local))

        def on_epoch_end(self):
            dataset.on_epoch_end()

    return ShardedPyDataset()
