"""Each process's part of the data, with the engine's real Keras."""
import numpy as np
import pytest

from tests.conftest import engine_or_skip

keras = engine_or_skip()

from agnostic.fit import sharding  # noqa: E402

# Keras 2.2 (keras-mxnet) has no PyDataset: there keras-mxnet splits batches.
HAS_PYDATASET = hasattr(keras.utils, "PyDataset")


class Batches(keras.utils.PyDataset if HAS_PYDATASET else object):
    """A user's dataset with its own loading settings."""

    def __init__(self):
        super().__init__(workers=3, use_multiprocessing=True, max_queue_size=7)
        self.x = np.arange(24, dtype="float32").reshape(12, 2)
        self.epochs_ended = 0

    def __len__(self):
        return 3

    def __getitem__(self, index):
        part = slice(index * 4, (index + 1) * 4)
        return self.x[part], self.x[part, 0]

    def on_epoch_end(self):
        self.epochs_ended += 1


@pytest.mark.skipif(not HAS_PYDATASET, reason="Keras 2.2 has no keras.utils.PyDataset")
def test_a_sharded_pydataset_keeps_the_users_loading_settings():
    users = Batches()
    shard = sharding.shard_batched(users, rank=1, world=2)
    assert isinstance(shard, keras.utils.PyDataset)
    assert (shard.workers, shard.use_multiprocessing, shard.max_queue_size) == (3, True, 7)
    assert len(shard) == 3
    x, y = shard[1]  # the second half of global batch 1: samples 6 and 7
    np.testing.assert_array_equal(x, users.x[6:8])
    np.testing.assert_array_equal(y, users.x[6:8, 0])
    shard.on_epoch_end()
    assert users.epochs_ended == 1


@pytest.mark.skipif(not HAS_PYDATASET, reason="Keras 2.2 has no keras.utils.PyDataset")
def test_batches_that_come_made_are_checked_where_the_strategy_needs_equal_parts():
    import agnostic

    class Odd(Batches):  # 4 rows a batch, then 3: no equal halves
        def __getitem__(self, index):
            x, y = super().__getitem__(index)
            return (x[:3], y[:3]) if index == len(self) - 1 else (x, y)

    # A PyDataset: its first and last batches, before any work.
    with pytest.raises(agnostic.BatchSplitError, match="PyDataset batch 2: batch_size=3 "):
        sharding.shard_batched(Odd(), rank=0, world=2, even=True)
    assert len(sharding.shard_batched(Odd(), rank=0, world=2)) == 3  # parts of any size
    # A generator: each batch as it comes, after the ones before were taken.
    batches = (np.arange(n, dtype="float32") for n in (4, 4, 3))
    parts = sharding.shard_batched(batches, rank=1, world=2, even=True)
    np.testing.assert_array_equal(next(parts), [2, 3])
    np.testing.assert_array_equal(next(parts), [2, 3])
    with pytest.raises(agnostic.BatchSplitError, match="generator batch 2: batch_size=3 "):
        next(parts)
    batches = (np.arange(n, dtype="float32") for n in (4, 3))
    assert [len(part) for part in sharding.shard_batched(batches, rank=1, world=2)] == [2, 1]


def test_a_batch_is_taken_in_parts_by_name():
    given = {"x": np.arange(8), "y": np.arange(8) * 10, "sample_weight": None}
    sharding.take_part(given, ("x", "y", "sample_weight"), rank=1, world_size=4)
    assert given["x"].tolist() == [2, 3] and given["y"].tolist() == [20, 30]
    assert given["sample_weight"] is None


def test_input_that_cannot_be_sharded_names_what_can():
    import agnostic

    class Stream:  # an iterable whose samples cannot be counted, say a tf.data pipeline
        def __iter__(self):
            return iter(())

    with pytest.raises(agnostic.UnsupportedInputError) as caught:
        sharding.shard("fit", Stream(), [None], 32, rank=0, world_size=2)
    message = str(caught.value)
    assert "Received: x of type Stream" in message
    assert "keras.utils.PyDataset" in message and "generator" in message
    assert "NumPy arrays" in message
