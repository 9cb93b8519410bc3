"""single-device: compile the template itself, on the engine's default device."""
from agnostic import devices, plan as plan_lib, strategies
from agnostic.strategies import base


class SingleDeviceStrategy(base.Strategy):
    name = "single-device"

    def compile(self, template, compile_kwargs):
        replicated = plan_lib.MULTI_DEVICE.get(self.plan.backend)
        if replicated and self.plan.devices[0] != devices.list_devices(self.plan.backend).devices[0]:
            # Only the engine's own scope places a model on another device
            # (gpus=[2]): its strategy, over that one device, does it.
            strategy = strategies.get(replicated)(
                self.plan, cpu_merge=self.cpu_merge, cpu_relocation=self.cpu_relocation
            )
            return strategy.compile(template, compile_kwargs)
        template.compile(**compile_kwargs)
        return template
