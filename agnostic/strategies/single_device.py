"""single-device: compile the template itself, on the engine's default
device; or, where the plan says so (gpus=[2] on torch), rebuild it in the
engine's device scope on that device."""
from agnostic import pipeline
from agnostic.strategies import base


class SingleDeviceStrategy(base.Strategy):
    name = "single-device"

    def compile(self, template, compile_kwargs):
        if not self.plan.device_scope:
            template.compile(**compile_kwargs)
            pipeline.wrap(template, template, 1)
            return template
        import keras

        model = base.build_replica_model(template, keras.device(self.plan.devices[0]),
                                         compile_kwargs)
        pipeline.wrap(model, template, 1)
        return model
