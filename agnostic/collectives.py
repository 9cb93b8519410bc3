"""The chief's value on every process, through the engine's own collectives.

A `share` function takes a picklable value on the chief (process 0) and
returns it on every process; what the others pass is ignored. Like any
collective, every process must call it at the same point. Machines need not
share a disk: BackupAndRestore's chief reads its backup and shares it.

Example:
    >>> epoch = share(read_epoch() if is_chief else None)  # on every process

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


def torch_share(value):
    """torch.distributed's own broadcast of pickled objects, from rank 0."""
    import torch.distributed as dist

    box = [value if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def jax_share(value):
    """Multi-process JAX: the pickled value as arrays, broadcast by
    multihost_utils.broadcast_one_to_all from process 0."""
    import jax
    from jax.experimental import multihost_utils

    return _through_arrays(value, jax.process_index() == 0,
                           multihost_utils.broadcast_one_to_all)


def tf_workers_share(workers):
    """The `share` of MultiWorkerMirroredStrategy `workers`: the pickled value
    as arrays, summed over the replicas with zeros everywhere but on the
    chief's first one (the strategy has no broadcast of its own)."""
    import numpy as np
    import tensorflow as tf

    chief = workers.cluster_resolver.task_id == 0

    def broadcast(array):
        def value(context):
            first = chief and context.replica_id_in_sync_group == 0
            return tf.constant(array if first else np.zeros_like(array))

        values = workers.experimental_distribute_values_from_function(value)
        return workers.reduce("SUM", values, axis=None).numpy()

    return lambda value: _through_arrays(value, chief, broadcast)


def _through_arrays(value, is_chief, broadcast):
    """`value` pickled on the chief and sent as int32 arrays, whose shape every
    process must know: first its length, then the bytes themselves.

    `broadcast(array)` returns the chief's array on every process. Summing
    zeros into an int32 keeps every bit, which floats would not."""
    import numpy as np

    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL) if is_chief else b""
    header = np.frombuffer(len(payload).to_bytes(_HEADER_BYTES, "little"), np.int32)
    header = broadcast(header if is_chief else np.zeros_like(header))
    size = int.from_bytes(np.asarray(header, np.int32).tobytes(), "little")
    words = np.zeros(-(-size // 4), np.int32)  # whole words, the last one padded
    if is_chief:
        words.view(np.uint8)[:size] = np.frombuffer(payload, np.uint8)
    received = np.asarray(broadcast(words), np.int32)
    return pickle.loads(received.tobytes()[:size])
