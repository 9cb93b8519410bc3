"""Summing torch tensors across processes, for torch-ddp: the initial
weights, the metrics' states and the moving batch statistics, in buckets (one
collective per bucket, not per tensor). Gradients go through torch's
DistributedDataParallel instead (engines.torch.gradients).
"""
BUCKET_BYTES = 25 * 1024 * 1024


def buckets(tensors):
    """Groups of `tensors` of one dtype each (joined in one tensor, an int32
    seed would pass through float32 and lose its last bits), of at least
    BUCKET_BYTES but each dtype's last."""
    by_dtype = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for same in by_dtype.values():
        bucket, size = [], 0
        for tensor in same:
            bucket.append(tensor)
            size += tensor.numel() * tensor.element_size()
            if size >= BUCKET_BYTES:
                yield bucket
                bucket, size = [], 0
        if bucket:
            yield bucket


def flat(bucket):
    import torch

    return torch.cat([t.detach().reshape(-1) for t in bucket])


def unflatten_into(values, bucket):
    offset = 0
    for tensor in bucket:
        count = tensor.numel()
        tensor.copy_(values[offset:offset + count].view_as(tensor))
        offset += count


def broadcast(tensors):
    """Every process gets rank 0's values of `tensors`, in place."""
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for bucket in buckets(tensors):
            values = flat(bucket)
            dist.broadcast(values, src=0)
            unflatten_into(values, bucket)


def all_reduce_sum(tensors):
    """Every process gets the sum of `tensors` over all processes, in place.

    Tensors on torch's "meta" device (Keras's symbolic build traces
    `compute_metrics` on them before fit's first epoch) hold no values and
    are left alone: torch's meta collective sends nothing, but draws an id
    from Python's global `random`, which would move the order in which fit
    shuffles a PyDataset's batches in the first epoch away from one
    device's."""
    import torch.distributed as dist

    tensors = [tensor for tensor in tensors if not tensor.is_meta]
    pending = []
    for bucket in buckets(tensors):
        values = flat(bucket)
        pending.append((dist.all_reduce(values, async_op=True), values, bucket))
    for work, values, bucket in pending:
        work.wait()
        unflatten_into(values, bucket)


def all_reduce_mean(tensors, world_size):
    """Every process gets the mean of `tensors` over all processes, in place."""
    all_reduce_sum(tensors)
    for tensor in tensors:
        tensor.div_(world_size)
