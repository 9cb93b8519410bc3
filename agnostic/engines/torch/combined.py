"""What each process computes from its own rows, combined across the
processes (torch-ddp): batch normalization's moving statistics, a layer's
own state, the metrics' results and a step's own logs, so that every
process (and the saved model) holds what one device would; and the
collectives that combine them: torch tensors broadcast from rank 0 or
summed across processes in buckets (one collective per bucket, not per
tensor), the initial weights included. Gradients go through torch's
DistributedDataParallel instead (engines.torch.gradients).

Each wrapping function returns the wraps it needs, (owner, method name,
wrapper) triples that torch-ddp applies in one place (agnostic/methods.py)."""
from agnostic.compat import step_logs
from agnostic import batching, methods

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




def average_moving_statistics(model, moving, world_size):
    """Per-process batch statistics: after each step the `moving` ones
    (batch_norm.moving_statistics) are averaged, so every process (and the
    saved model) holds the same."""
    import torch

    statistics = [v.value for v in moving]
    if not statistics:
        return []

    def step(train_step):
        def run(*args, **kwargs):
            logs = train_step(*args, **kwargs)
            with torch.no_grad():
                all_reduce_mean(statistics, world_size)
            return logs

        return run

    return [(model, "train_step", step)]


def combine_layer_state(model, moving, world_size):
    """A layer's own state updated in its call, from each process's rows:
    after each training step it is combined across processes as its
    declared `aggregation` says ("sum": every process's change added once;
    "mean": the processes' values averaged; "only_first_replica": rank 0's),
    so every process (and the saved model) holds what one device would for
    sums, and for means of equal shares. Batch normalization's statistics
    (`moving`) are kept by batch_norm.synchronize / average_moving_statistics."""
    import torch

    statistics = {id(v) for v in moving}

    def declared(kind):
        return [v for v in model.non_trainable_variables
                if v.aggregation == kind and id(v) not in statistics]

    def step(train_step):
        def run(*args, **kwargs):
            summed = [v.value for v in declared("sum")]
            with torch.no_grad():
                before = [value.detach().clone() for value in summed]
            logs = train_step(*args, **kwargs)
            with torch.no_grad():
                changes = [value - old for value, old in zip(summed, before)]
                all_reduce_sum(changes)
                for value, old, change in zip(summed, before, changes):
                    value.copy_(old + change)
                all_reduce_mean([v.value for v in declared("mean")], world_size)
                broadcast([v.value for v in declared("only_first_replica")])
            return logs

        return run

    return [(model, "train_step", step)]


def aggregate_metrics(model):
    """Metric results over all processes' samples: the metrics' states (totals
    and counts) are summed across processes, read, then put back."""
    import torch

    def wrapper(get_metrics_result):
        def run():
            variables = [v.value for m in model.metrics for v in m.variables]
            with torch.no_grad():
                kept = [v.detach().clone() for v in variables]
                all_reduce_sum(variables)
                try:
                    # A count metric's result is its variable itself: keep
                    # the global value, not the one put back below.
                    return {name: value.detach().clone() if torch.is_tensor(value) else value
                            for name, value in get_metrics_result().items()}
                finally:
                    for variable, value in zip(variables, kept):
                        variable.copy_(value)

        return run

    return [(model, "get_metrics_result", wrapper)]


def global_step_logs(model):
    """A step of the program's own reports what it returns, after each batch
    (the progress bar, the callbacks) and, where its logs are not named as
    the metrics' results (the keras.io VAE returns "loss" from a tracker
    named "total_loss"; the fit guide nests the compiled metrics' results in
    one dict), in the history too: this process's share. Each log that is
    one of the metrics' results becomes that metric's result over every
    process; any other is averaged over the processes, each process's value
    weighted by its rows (its share of the batch). Keras's own step is left
    as it is: it returns get_metrics_result, summed already."""
    import torch

    steps = [name for name in step_logs.STEPS if methods.own(model, name)]

    def same(one, other):
        if not (torch.is_tensor(one) and torch.is_tensor(other)) or one.shape != other.shape:
            return False
        return bool(torch.equal(one.detach().to(other.device), other.detach()))

    def wrapper(step):
        def run(*args, **kwargs):
            logs = step(*args, **kwargs)
            if not isinstance(logs, dict):
                return logs
            rows = batching.num_samples(batching.step_data(args, kwargs))
            # As Keras reads them: the compiled metrics' dict, entry by entry.
            local = step_logs.in_place(
                {metric.name: metric.result() for metric in model.metrics}, model)
            logs = step_logs.in_place(logs, model)
            every = model.get_metrics_result()  # a collective: every process calls it
            # One collective over the same keys everywhere, whatever matches.
            scalars = sorted(key for key, value in logs.items()
                             if torch.is_tensor(value) and value.numel() == 1)
            averaged = {}
            if scalars:
                weight = 1.0 if rows is None else float(rows)
                values = [logs[key].detach().float().reshape(()) * weight if weight
                          else torch.zeros(()) for key in scalars]  # none: no NaN either
                stacked = torch.stack(values + [torch.tensor(weight)])
                all_reduce_sum([stacked])
                averaged = dict(zip(scalars, stacked[:-1] / stacked[-1]))
            result = {}
            for key, value in logs.items():
                match = key if key in local else next(
                    (name for name, own in local.items() if same(own, value)), None)
                if match is not None and match in every:
                    result[key] = every[match]
                else:
                    result[key] = averaged.get(key, value)
            return result

        return run

    return [(model, name, wrapper) for name in steps]
