"""torch-device-parallel: each call placed with agnostic.device() runs on its
device (strategies/device_parallel.py), in one process, or in each of
several processes, a replica each on its own devices, the gradients averaged
as by torch-ddp."""
from agnostic.fit import pipeline
from agnostic.engines.torch import ddp
from agnostic.strategies import device_parallel


class TorchDeviceParallelStrategy(ddp.TorchDDPStrategy):
    name = "torch-device-parallel"
    multi_device = True

    def compile(self, model, call):
        if self.plan.num_processes > 1:  # replicas of the placed model
            return super().compile(model, call)
        device_parallel.placed_model(self.plan, model, call)
        pipeline.wrap(model, 1)
        return model

    def replica(self, model, compile_call, rank):
        """The plan's devices are the replicas' in turn."""
        return device_parallel.placed_model(self.plan, model, compile_call, rank)
