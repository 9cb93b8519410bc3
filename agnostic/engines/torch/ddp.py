"""torch-ddp: one process per device, gradients averaged across processes.

Keras 3.13-3.15 have no multi-device `fit` on torch, so this strategy supplies the
data-parallel parts around Keras's own training loop: the same initial weights
everywhere (broadcast from rank 0), a shard of each global batch per process,
gradients averaged by torch's DistributedDataParallel while backward runs,
each share weighted by its rows (engines.torch.gradients), and metrics
aggregated over all processes. Keras 3.16 does the averaging and the metrics
itself (compat.torch_keras_ddp), and agnostic adds only the weights. Only the
chief prints or writes files.
"""
import atexit
import datetime
import logging
import sys

from agnostic import cluster, errors
from agnostic.fit import batch_norm, batching, collectives
from agnostic.fit import global_batch, in_place, methods, pipeline
from agnostic.cluster import torch_join
from agnostic.compat import step_logs, torch_keras_ddp
from agnostic.launch import local, processes
from agnostic.engines.torch import batch_view, gradients, reduce, start
from agnostic.strategies import base

logger = logging.getLogger("agnostic")

class TorchDDPStrategy(base.Strategy):
    name = "torch-ddp"
    # Whether each process's replica spans several devices (device
    # parallelism within, see device_parallel): DistributedDataParallel then
    # takes no device ids.
    multi_device = False

    def replica(self, model, call, rank):
        """This process's model, compiled: the program's own."""
        call(model)
        return model

    def compile(self, model, call):
        import torch
        import torch.distributed as dist

        # The scheduler's job (or Ray's group) the plan found, else processes
        # started here.
        group = self.plan.job
        if self.plan.starts_processes:
            group = local.launch(self.plan.num_processes, _device_indexes(self.plan))
        _share_the_cores(self.plan.threads)
        if not dist.is_initialized():
            if self.plan.process_group == "nccl":
                start.pin(torch, group)
            # Every rank present within AGNOSTIC_JOIN_SECONDS, or an error
            # naming the missing ones; the store listens on the job's address.
            store = torch_join.store(group, cluster.join_seconds_at_start())
            dist.init_process_group(
                self.plan.process_group, store=store,
                rank=group.rank, world_size=group.world_size,
                timeout=datetime.timedelta(minutes=10),
            )
            atexit.register(_leave_group)
            local.report_failures(group.rank)
        model = self.replica(model, call, group.rank)
        reduce.broadcast([v.value for v in model.variables])
        if not batch_norm.synchronize(model, "torch", self.sync_batch_norm):
            _average_moving_statistics(model, group.world_size)
        by_keras = torch_keras_ddp.keras_averages_gradients(model)
        if by_keras:
            logger.info("Keras %s trains under DistributedDataParallel itself; "
                        "its gradient averaging is used.", keras_version())
        # Not yet where Keras 3.16 trains under DistributedDataParallel
        # itself: its processes compute on their own shares there.
        global_view = self.global_view and not torch_keras_ddp.keras_is_data_parallel(model)
        optimizers = in_place.optimizers(model, call)
        # Before the gradients' averaging wraps the optimizers: it runs first.
        self.split_state(model, optimizers, group.rank, group.world_size)
        gradients.average(model, group.world_size, self.multi_device,
                                optimizers, by_keras, global_view)
        if not global_view:  # else every process's metrics hold the whole batch's
            if not torch_keras_ddp.keras_is_data_parallel(model):
                _aggregate_metrics(model)
            _global_step_logs(model)
        gradients.empty_shares(model)
        _combined_layer_state(model, group.world_size)
        if global_view:
            global_batch.see_the_global_batch(model, batch_view.maker(group.world_size))
        processes = pipeline.Processes(group.rank, group.world_size, barrier=dist.barrier,
                                       share=collectives.torch_share)
        pipeline.wrap(model, group.world_size, processes=processes, even_shares=False,
                      per_replica_calls=True)
        return model

    def split_state(self, model, optimizers, rank, world_size):
        """Where each process keeps part of the weights and optimizer state
        (torch-sharded); here every process keeps all of them."""


def _share_the_cores(threads):
    """The plan's intra-op thread count for this process (None: the user's
    OMP_NUM_THREADS or the engine's default stays)."""
    import torch

    if threads and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _leave_group():
    """Ends the process group this strategy started, at a normal exit, while
    the interpreter is still whole: torch's communication threads may hold
    finished collectives, and freeing them during the interpreter's teardown
    can abort the process ("terminate called without an active exception").
    Not after an uncaught exception or Ctrl-C: a collective may then be left
    waiting for a peer, and ending the group would wait for it too."""
    import torch.distributed as dist

    if getattr(sys, "last_value", None) is None and dist.is_initialized():
        rank = dist.get_rank()
        try:
            dist.destroy_process_group()
        except Exception as error:  # exiting anyway; say so, do not fail
            logger.debug("ending the process group at exit: %s", error)
        else:
            processes.mark_finished(rank)


def _device_indexes(plan):
    """The CUDA index of each rank's (first) device; the rank itself on CPU."""
    if not plan.devices[0].startswith("cuda"):
        return list(range(plan.num_processes))
    per_process = len(plan.devices) // plan.num_processes
    indexes = [int(device.split(":")[1]) for device in plan.devices[::per_process]]
    if indexes[0] != 0:
        # This process is rank 0 and its model is already on cuda:0.
        raise errors.LaunchError(
            f"torch-ddp on {', '.join(plan.devices)}: the process that calls "
            "backend_agnostic_compile becomes rank 0, and its model was built on "
            "cuda:0 before the call. Include device 0 first in `gpus`, or choose "
            "the GPUs with CUDA_VISIBLE_DEVICES (e.g. CUDA_VISIBLE_DEVICES=2,3) "
            "and pass gpus=None."
        )
    return indexes


def keras_version():
    import keras

    return keras.__version__


def _average_moving_statistics(model, world_size):
    """Per-process batch statistics: after each step the moving ones are
    averaged, so every process (and the saved model) holds the same."""
    import torch

    statistics = [v.value for v in batch_norm.moving_statistics(model)]
    if not statistics:
        return

    def step(train_step):
        def run(*args, **kwargs):
            logs = train_step(*args, **kwargs)
            with torch.no_grad():
                reduce.all_reduce_mean(statistics, world_size)
            return logs

        return run

    methods.wrap_method(model, "train_step", step)


def _combined_layer_state(model, world_size):
    """A layer's own state updated in its call, from each process's rows:
    after each training step it is combined across processes as its
    declared `aggregation` says ("sum": every process's change added once;
    "mean": the processes' values averaged; "only_first_replica": rank 0's),
    so every process (and the saved model) holds what one device would for
    sums, and for means of equal shares. Batch normalization's statistics are
    kept by batch_norm.synchronize / _average_moving_statistics."""
    import torch

    statistics = {id(v) for v in batch_norm.moving_statistics(model)}

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

    methods.wrap_method(model, "train_step", step)


def _aggregate_metrics(model):
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

    methods.wrap_method(model, "get_metrics_result", wrapper)


def _global_step_logs(model):
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

    for name in step_logs.STEPS:
        if methods.own(model, name):  # Keras's own returns get_metrics_result, summed
            methods.wrap_method(model, name, wrapper)


def _same(one, other):
    import torch

    if not (torch.is_tensor(one) and torch.is_tensor(other)) or one.shape != other.shape:
        return False
    return bool(torch.equal(one.detach().to(other.device), other.detach()))
