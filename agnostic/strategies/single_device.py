"""single-device: compile the template itself, on the engine's default device."""
from agnostic import devices, plan as plan_lib, strategies
from agnostic.strategies import base


class SingleDeviceStrategy(base.Strategy):
    name = "single-device"

    def compile(self, template, compile_kwargs):
        device = self.plan.devices[0]
        replicated = plan_lib.MULTI_DEVICE.get(self.plan.backend)
        listing = devices.list_devices(self.plan.backend) if replicated else None
        if not replicated or device == listing.devices[0] or not listing.accelerators \
                and replicated in plan_lib.PROCESS_PER_DEVICE:
            template.compile(**compile_kwargs)  # the default device (or the one CPU)
            base.wrap_returned_model(template, template, 1)
            return template
        if replicated in plan_lib.PROCESS_PER_DEVICE:
            import keras

            # One process: the engine's device scope places the rebuilt model.
            model = base.build_replica_model(template, keras.device(device), compile_kwargs)
            base.wrap_returned_model(model, template, 1)
            return model
        # Only the engine's own scope places a model on another device
        # (gpus=[2]): its strategy, over that one device, does it.
        strategy = strategies.get(replicated)(
            self.plan, cpu_merge=self.cpu_merge, cpu_relocation=self.cpu_relocation,
            sync_batch_norm=self.sync_batch_norm,
        )
        return strategy.compile(template, compile_kwargs)
