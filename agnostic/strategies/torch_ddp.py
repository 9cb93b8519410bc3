"""torch-ddp: one process per device, gradients averaged across processes.

Keras 3.15 has no multi-device `fit` on torch, so this strategy supplies the
data-parallel parts around Keras's own training loop: the same initial weights
everywhere (broadcast from rank 0), a shard of each global batch per process,
gradients summed across processes in buckets before the optimizer step, and
metrics aggregated over all processes. Only the chief prints or writes files.
"""
import datetime
import inspect
import logging

from agnostic import errors, sharding
from agnostic.launch import environment, local
from agnostic.strategies import base

logger = logging.getLogger("agnostic")
BUCKET_BYTES = 25 * 1024 * 1024


class TorchDDPStrategy(base.Strategy):
    name = "torch-ddp"

    def compile(self, template, compile_kwargs):
        import torch
        import torch.distributed as dist

        group = environment.from_environment()
        if group is None:
            group = local.launch(self.plan.num_processes, _device_indexes(self.plan))
        if not dist.is_initialized():
            on_gpu = torch.cuda.is_available()
            if on_gpu:
                torch.cuda.set_device(group.local_rank)
            dist.init_process_group(
                "nccl" if on_gpu else "gloo", init_method=group.address,
                rank=group.rank, world_size=group.world_size,
                timeout=datetime.timedelta(minutes=10),
            )
        template.compile(**compile_kwargs)
        _broadcast([v.value for v in template.variables])
        if keras_averages_gradients():
            logger.info("agnostic: this Keras trains under DistributedDataParallel itself; "
                        "its gradient averaging is used.")
        else:
            _average_gradients(template, group.world_size)
        _aggregate_metrics(template)
        sharding.split_calls(template, group.rank, group.world_size)
        base.guard_files(template, is_chief=group.is_chief)
        return template


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


def keras_averages_gradients():
    """Whether the installed Keras wraps the model in DistributedDataParallel
    on its own (Keras after 3.15 does once torch.distributed is initialised)."""
    from keras.src.backend.torch import trainer

    try:
        return "DistributedDataParallel" in inspect.getsource(trainer)
    except (OSError, TypeError):
        return False


def _buckets(tensors):
    bucket, size = [], 0
    for tensor in tensors:
        bucket.append(tensor)
        size += tensor.numel() * tensor.element_size()
        if size >= BUCKET_BYTES:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def _flat(bucket):
    import torch

    return torch.cat([t.detach().reshape(-1) for t in bucket])


def _unflatten_into(flat, bucket):
    offset = 0
    for tensor in bucket:
        count = tensor.numel()
        tensor.copy_(flat[offset:offset + count].view_as(tensor))
        offset += count


def _broadcast(tensors):
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for bucket in _buckets(tensors):
            flat = _flat(bucket)
            dist.broadcast(flat, src=0)
            _unflatten_into(flat, bucket)


def _all_reduce_sum(tensors):
    import torch.distributed as dist

    pending = []
    for bucket in _buckets(tensors):
        flat = _flat(bucket)
        pending.append((dist.all_reduce(flat, async_op=True), flat, bucket))
    for work, flat, bucket in pending:
        work.wait()
        _unflatten_into(flat, bucket)


def _average_gradients(model, world_size):
    """Before each optimizer step, every process gets the mean gradient."""

    def wrapper(apply):
        def run(gradients, variables=None):
            present = [g for g in gradients if g is not None]
            _all_reduce_sum(present)
            for gradient in present:
                gradient.div_(world_size)
            return apply(gradients, variables)

        return run

    base.wrap_method(model.optimizer, "apply", wrapper)


def _aggregate_metrics(model):
    """Metric results over all processes' samples: the metrics' states (totals
    and counts) are summed across processes, read, then put back."""
    import torch

    def wrapper(get_metrics_result):
        def run():
            variables = [v.value for m in model.metrics for v in m.variables]
            with torch.no_grad():
                kept = [v.detach().clone() for v in variables]
                _all_reduce_sum(variables)
                try:
                    return get_metrics_result()
                finally:
                    for variable, value in zip(variables, kept):
                        variable.copy_(value)

        return run

    base.wrap_method(model, "get_metrics_result", wrapper)
