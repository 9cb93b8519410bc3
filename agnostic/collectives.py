"""Values between one job's processes, through the engine's own collectives.

A `share` function takes a picklable value on process `source` (the chief,
0, unless told) and returns it on every process; what the others pass is
ignored. `share.gather(value)` returns every process's value, in rank order,
and `share.rank()` this process's rank. Like any collective, every process
must call them at the same point. Machines need not share a disk:
BackupAndRestore gathers what each process's folder holds and shares the
newest backup from the process that holds it.

Example:
    >>> epoch = share(read_epoch() if is_chief else None)  # on every process
    >>> held = share.gather(my_epoch)                   # [rank 0's, rank 1's, ...]

The strategies hand theirs to the models they return (`attach`), where the
callbacks find it (`of`); single-process strategies have none.
"""
import pickle

_KEY = "_agnostic_share"
_HEADER_BYTES = 8  # the payload's length, sent first: the others do not know it


def attach(model, share):
    """`share` (or None) is how `model`'s processes share the chief's values."""
    model.__dict__[_KEY] = share


def of(model):
    """The `share` function attached to `model`; None with one process."""
    return model.__dict__.get(_KEY)


class Share:
    """`broadcast(value, source)`, `rank()` and `size()` of one engine's
    processes, as the `share` described above. `gather` defaults to one
    broadcast from each process: for small values."""

    def __init__(self, broadcast, rank, size, gather=None):
        self._broadcast, self.rank, self._size, self._gather = broadcast, rank, size, gather

    def __call__(self, value, source=0):
        return self._broadcast(value, source)

    def gather(self, value):
        if self._gather is not None:
            return self._gather(value)
        return [self(value, source) for source in range(self._size())]


def _torch_broadcast(value, source):
    """torch.distributed's own broadcast of pickled objects."""
    import torch.distributed as dist

    box = [value if dist.get_rank() == source else None]
    dist.broadcast_object_list(box, src=source)
    return box[0]


def _torch_gather(value):
    import torch.distributed as dist

    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _torch_rank():
    import torch.distributed as dist

    return dist.get_rank()


torch_share = Share(_torch_broadcast, _torch_rank, None, gather=_torch_gather)


def _jax_broadcast(value, source):
    """Multi-process JAX: the pickled value as arrays, broadcast by
    multihost_utils.broadcast_one_to_all from process `source`."""
    import functools

    import jax
    from jax.experimental import multihost_utils

    is_source = jax.process_index() == source
    return _through_arrays(value, is_source, functools.partial(
        multihost_utils.broadcast_one_to_all, is_source=is_source))


def _jax_rank():
    import jax

    return jax.process_index()


def _jax_size():
    import jax

    return jax.process_count()


jax_share = Share(_jax_broadcast, _jax_rank, _jax_size)


def tf_workers_share(workers):
    """The `share` of MultiWorkerMirroredStrategy `workers`: the pickled value
    as arrays, summed over the replicas with zeros everywhere but on the
    source's first one (the strategy has no broadcast of its own)."""
    import numpy as np
    import tensorflow as tf

    rank = workers.cluster_resolver.task_id  # every process is a worker, rank order

    def size():
        return workers.cluster_resolver.cluster_spec().num_tasks("worker")

    def broadcast(value, source):
        # Replicas are numbered worker by worker, each with as many devices.
        first = source * (workers.num_replicas_in_sync // size())

        def sent(array):
            def local(context):
                mine = context.replica_id_in_sync_group == first
                return tf.constant(array if mine else np.zeros_like(array))

            values = workers.experimental_distribute_values_from_function(local)
            return workers.reduce("SUM", values, axis=None).numpy()

        return _through_arrays(value, rank == source, sent)

    return Share(broadcast, lambda: rank, size)


def _through_arrays(value, is_source, broadcast):
    """`value` pickled on the source and sent as int32 arrays, whose shape every
    process must know: first its length, then the bytes themselves.

    `broadcast(array)` returns the source's array on every process. Summing
    zeros into an int32 keeps every bit, which floats would not."""
    import numpy as np

    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL) if is_source else b""
    header = np.frombuffer(len(payload).to_bytes(_HEADER_BYTES, "little"), np.int32)
    header = broadcast(header if is_source else np.zeros_like(header))
    size = int.from_bytes(np.asarray(header, np.int32).tobytes(), "little")
    words = np.zeros(-(-size // 4), np.int32)  # whole words, the last one padded
    if is_source:
        words.view(np.uint8)[:size] = np.frombuffer(payload, np.uint8)
    received = np.asarray(broadcast(words), np.int32)
    return pickle.loads(received.tobytes()[:size])
