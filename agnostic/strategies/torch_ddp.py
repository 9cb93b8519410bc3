"""torch-ddp: one process per device, gradients averaged across processes.

Keras 3.13-3.15 have no multi-device `fit` on torch, so this strategy supplies the
data-parallel parts around Keras's own training loop: the same initial weights
everywhere (broadcast from rank 0), a shard of each global batch per process,
gradients summed across processes in buckets while backward runs, and
metrics aggregated over all processes. Only the chief prints or writes files.
"""
import atexit
import datetime
import logging
import sys

from agnostic import batch_norm, cluster, collectives, errors, sharding
from agnostic.compat import torch_batch_norm, torch_keras_ddp
from agnostic.launch import local
from agnostic.strategies import base, torch_reduce

logger = logging.getLogger("agnostic")


class TorchDDPStrategy(base.Strategy):
    name = "torch-ddp"

    def compile(self, template, compile_kwargs):
        import torch
        import torch.distributed as dist

        # The scheduler's job (or Ray's group), else processes started here.
        group = cluster.job("torch")
        if group is None:
            group = local.launch(self.plan.num_processes, _device_indexes(self.plan))
        if not dist.is_initialized():
            on_gpu = torch.cuda.is_available()
            if on_gpu:  # one GPU visible: the scheduler gave it to this process
                torch.cuda.set_device(group.local_rank if torch.cuda.device_count() > 1 else 0)
            dist.init_process_group(
                "nccl" if on_gpu else "gloo", init_method=group.address,
                rank=group.rank, world_size=group.world_size,
                timeout=datetime.timedelta(minutes=10),
            )
            atexit.register(_leave_group)
            local.report_failures(group.rank)
        template.compile(**compile_kwargs)
        torch_reduce.broadcast([v.value for v in template.variables])
        if not torch_batch_norm.synchronize(template, self.sync_batch_norm):
            _average_moving_statistics(template, group.world_size)
        if torch_keras_ddp.keras_averages_gradients(template):
            logger.info("agnostic: Keras %s trains under DistributedDataParallel itself; "
                        "its gradient averaging is used.", keras_version())
        else:
            _average_gradients(template, group.world_size)
        if not torch_keras_ddp.keras_is_data_parallel(template):
            _aggregate_metrics(template)
        sharding.split_calls(template, group.rank, group.world_size)
        base.guard_files(template, is_chief=group.is_chief, barrier=dist.barrier,
                         share=collectives.torch_share)
        return template


def _leave_group():
    """Ends the process group this strategy started, at a normal exit, while
    the interpreter is still whole: torch's communication threads may hold
    finished collectives, and freeing them during the interpreter's teardown
    can abort the process ("terminate called without an active exception").
    Not after an uncaught exception or Ctrl-C: a collective may then be left
    waiting for a peer, and ending the group would wait for it too."""
    import torch.distributed as dist

    if getattr(sys, "last_value", None) is None and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as error:  # exiting anyway; say so, do not fail
            logger.debug("agnostic: ending the process group at exit: %s", error)


def _device_indexes(plan):
    """The CUDA index of each rank's device; the rank itself on CPU."""
    if not plan.devices[0].startswith("cuda"):
        return list(range(plan.num_processes))
    indexes = [int(device.split(":")[1]) for device in plan.devices]
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


def _average_gradients(model, world_size):
    """Before each optimizer step, every process gets the mean gradient; the
    sums start during backward (torch_reduce.GradientReducer)."""
    if model.__dict__.get("_agnostic_reducer") is not None:
        model.__dict__["_agnostic_reducer"].close()  # compiled again
    reducer = torch_reduce.GradientReducer(model.trainable_variables, world_size)

    step_name = f"{type(model).__name__}.train_step"

    def step(train_step):
        def run(*args, **kwargs):
            return reducer.step(lambda: train_step(*args, **kwargs), step_name)

        return run

    def apply(original):
        def run(gradients, variables=None):
            reducer.average(gradients, variables)
            return original(gradients, variables)

        return run

    base.wrap_method(model, "train_step", step)
    base.wrap_method(model.optimizer, "apply", apply)
    model.__dict__["_agnostic_reducer"] = reducer  # read by tests and benchmarks


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
                torch_reduce.all_reduce_mean(statistics, world_size)
            return logs

        return run

    base.wrap_method(model, "train_step", step)


def _aggregate_metrics(model):
    """Metric results over all processes' samples: the metrics' states (totals
    and counts) are summed across processes, read, then put back."""
    import torch

    def wrapper(get_metrics_result):
        def run():
            variables = [v.value for m in model.metrics for v in m.variables]
            with torch.no_grad():
                kept = [v.detach().clone() for v in variables]
                torch_reduce.all_reduce_sum(variables)
                try:
                    # A count metric's result is its variable itself: keep
                    # the global value, not the one put back below.
                    return {name: value.detach().clone() if torch.is_tensor(value) else value
                            for name, value in get_metrics_result().items()}
                finally:
                    for variable, value in zip(variables, kept):
                        variable.copy_(value)

        return run

    base.wrap_method(model, "get_metrics_result", wrapper)
