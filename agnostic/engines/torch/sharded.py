"""torch-sharded: torch-ddp with each large weight and its optimizer state
split over the processes (shard=True), as FSDP and ZeRO stage 3 do: each
process holds 1/N of each large weight's values and the optimizer's slots
for them (engines/torch/weight_shards.py, optimizer_shards.py);
a weight is gathered whole while a layer computes with it, and freed after.
The gradients are whole during a step and averaged by DistributedDataParallel
as in torch-ddp. Keras's layers read their variables' own tensors, not
module parameters that torch's FSDP could swap for shards, so the
gathering is agnostic's, at each variable's read.
"""
import contextlib

from agnostic import errors, methods
from agnostic.engines.torch import ddp, optimizer_shards, weight_shards


class TorchShardedStrategy(ddp.TorchDDPStrategy):
    name = "torch-sharded"

    @staticmethod
    def refuse(model, call):
        """Optimizers whose state cannot be split by slices (and mixed
        precision's loss scaling)."""
        import keras

        given = call.optimizers()
        if keras.config.dtype_policy().name == "mixed_float16":
            given.append(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()))
        for optimizer in given:
            why = optimizer_shards.refusal(optimizer)
            if why is not None:
                raise _refused(optimizer, why)

    def compile(self, model, call):
        self.shards, self.weights = [], None
        return super().compile(model, call)

    def split_state(self, model, optimizers, rank, world_size):
        for optimizer in optimizers:
            why = optimizer_shards.refusal(optimizer)
            if why is not None:  # found only once compiled (a model's own compile)
                raise _refused(optimizer, why)
        self.weights = weight_shards.of(model, rank, world_size)
        for optimizer in optimizers:
            shards = optimizer_shards.shards_of(optimizer, rank, world_size, self.weights)
            shards.install()
            self.shards.append(shards)
        wraps = [(model, "train_step", _in_steps(self.weights))]
        wraps += methods.around_saves(model, self._gathered)
        # Whole again after each (every process returns from them together):
        # outside fit a process may read the weights alone, or save on its own.
        wraps += [(model, name, _whole_after(self.weights))
                  for name in ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch")]
        return wraps

    @contextlib.contextmanager
    def _gathered(self):
        """The weights whole, and each optimizer slot whole on the chief."""
        with contextlib.ExitStack() as stack:
            for shards in self.shards:
                stack.enter_context(shards.gathered())
            stack.enter_context(self.weights.whole())
            yield


def _in_steps(weights):
    first = [True]

    def wrapper(train_step):
        def run(*args, **kwargs):
            with contextlib.ExitStack() as stack:
                if first[0]:
                    # DistributedDataParallel is made in the first step
                    # (torch_gradients): it broadcasts rank 0's weights, whole.
                    first[0] = False
                    stack.enter_context(weights.whole())
                stack.enter_context(weights.step())
                return train_step(*args, **kwargs)

        return run

    return wrapper


def _whole_after(weights):
    def wrapper(method):
        def run(*args, **kwargs):
            result = method(*args, **kwargs)
            weights.gather()  # not after an error: a process may have stopped
            return result

        return run

    return wrapper


def _refused(optimizer, why):
    name = optimizer if isinstance(optimizer, str) else type(optimizer).__name__
    return errors.NotSupportedError(
        f"shard=True on torch splits the optimizer state by slices of each weight, and {why}: "
        "its state cannot be split. Use one of Keras's "
        f"{', '.join(optimizer_shards.ELEMENTWISE)} (without mixed precision), or "
        f"shard=False. Received: optimizer={name!r}")
