"""torch-sharded: torch-ddp with the optimizer state split over the processes
(shard=True), as ZeRO stage 1 does (strategies/torch_optimizer_shards.py):
each process holds the optimizer's slots for 1/N of each large weight's
values, and the weights and gradients whole. Keras's layers read their
variables' own tensors, not module parameters that torch's FSDP could swap
for shards while they compute; the weights themselves stay copied here.
"""
import contextlib

from agnostic import errors, methods
from agnostic.strategies import torch_ddp, torch_optimizer_shards


class TorchShardedStrategy(torch_ddp.TorchDDPStrategy):
    name = "torch-sharded"

    def compile(self, model, call):
        _refuse_before_any_work(model, call)
        self.shards = []
        model = super().compile(model, call)
        for name in ("save", "save_weights"):  # every process gathers, the chief writes
            if hasattr(model, name):
                methods.wrap_method(model, name, self._gathered_first)
        return model

    def split_optimizer_state(self, model, optimizers, rank, world_size):
        for optimizer in optimizers:
            why = torch_optimizer_shards.refusal(optimizer)
            if why is not None:  # found only once compiled (a model's own compile)
                raise _refused(optimizer, why)
            shards = torch_optimizer_shards.shards_of(optimizer, rank, world_size)
            shards.install()
            self.shards.append(shards)

    def _gathered_first(self, save):
        def run(*args, **kwargs):
            with contextlib.ExitStack() as stack:
                for shards in self.shards:
                    stack.enter_context(shards.gathered())
                return save(*args, **kwargs)

        return run


def _refuse_before_any_work(model, call):
    import keras

    given = call.objects(keras.optimizers.Optimizer)
    named = call.kwargs.get("optimizer", call.args[0] if call.args else None)
    if isinstance(named, str):
        given.append(named)
    if keras.config.dtype_policy().name == "mixed_float16":
        given.append(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()))
    for optimizer in given:
        why = torch_optimizer_shards.refusal(optimizer)
        if why is not None:
            raise _refused(optimizer, why)


def _refused(optimizer, why):
    name = optimizer if isinstance(optimizer, str) else type(optimizer).__name__
    return errors.NotSupportedError(
        f"shard=True on torch splits the optimizer state by slices of each weight, and {why}: "
        "its state cannot be split. Use one of Keras's "
        f"{', '.join(torch_optimizer_shards.ELEMENTWISE)} (without mixed precision), or "
        f"shard=False. Received: optimizer={name!r}")
