"""single-device: compile the template itself, on the engine's default device."""
from agnostic.strategies import base


class SingleDeviceStrategy(base.Strategy):
    name = "single-device"

    def compile(self, template, compile_kwargs):
        template.compile(**compile_kwargs)
        return template
