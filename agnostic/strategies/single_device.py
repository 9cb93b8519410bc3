"""single-device: compile the program's model on the engine's default
device; or, where the plan says so (gpus=[2] on torch), with its variables
moved to that device first and its steps in the engine's device scope."""
from agnostic.fit import pipeline
from agnostic.compat import keras_variables
from agnostic.strategies import base


class SingleDeviceStrategy(base.Strategy):
    name = "single-device"

    def compile(self, model, call):
        if not self.plan.device_scope:
            call(model)
            pipeline.wrap(model, 1)
            return model
        import keras

        device = self.plan.devices[0]
        for variable in model.variables:
            keras_variables.moved(variable, device)
        with keras.device(device):
            call(model)
        pipeline.wrap(model, 1, scope=lambda: keras.device(device))
        return model
