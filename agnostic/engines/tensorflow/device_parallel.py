"""tf-device-parallel: each call placed with agnostic.device() runs on its
device (strategies/device_parallel.py), in this one process."""
from agnostic.fit import pipeline
from agnostic.strategies import base, device_parallel


class TFDeviceParallelStrategy(base.Strategy):
    name = "tf-device-parallel"

    def compile(self, model, call):
        device_parallel.placed_model(self.plan, model, call)
        pipeline.wrap(model, 1)
        return model
