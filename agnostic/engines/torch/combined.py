"""What each process computes from its own rows, combined across the
processes (torch-ddp): batch normalization's moving statistics, a layer's
own state, the metrics' results and a step's own logs, so that every
process (and the saved model) holds what one device would.

Each function returns the wraps it needs, (owner, method name, wrapper)
triples that torch-ddp applies in one place (agnostic/methods.py)."""
from agnostic.compat import step_logs
from agnostic.engines.torch import gradients, reduce
from agnostic import batching, methods


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
                reduce.all_reduce_mean(statistics, world_size)
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
                reduce.all_reduce_sum(changes)
                for value, old, change in zip(summed, before, changes):
                    value.copy_(old + change)
                reduce.all_reduce_mean([v.value for v in declared("mean")], world_size)
                reduce.broadcast([v.value for v in declared("only_first_replica")])
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
                reduce.all_reduce_sum(variables)
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

    def wrapper(step):
        def run(*args, **kwargs):
            logs = step(*args, **kwargs)
            if not isinstance(logs, dict):
                return logs
            rows = batching.num_samples(gradients.step_data(args, kwargs))
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
                reduce.all_reduce_sum([stacked])
                averaged = dict(zip(scalars, stacked[:-1] / stacked[-1]))
            result = {}
            for key, value in logs.items():
                match = key if key in local else next(
                    (name for name, own in local.items() if _same(own, value)), None)
                if match is not None and match in every:
                    result[key] = every[match]
                else:
                    result[key] = averaged.get(key, value)
            return result

        return run

    # Keras's own returns get_metrics_result, summed already.
    return [(model, name, wrapper) for name in step_logs.STEPS if methods.own(model, name)]


def _same(one, other):
    import torch

    if not (torch.is_tensor(one) and torch.is_tensor(other)) or one.shape != other.shape:
        return False
    return bool(torch.equal(one.detach().to(other.device), other.detach()))
