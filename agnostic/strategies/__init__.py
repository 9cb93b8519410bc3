"""The registry: Plan.strategy's name -> its class, one module per strategy.

An engine's strategies live in its folder, agnostic/engines/<engine>/, the
module named after the strategy less its engine's prefix ("torch-ddp":
engines/torch/ddp.py); what serves every engine (the base class, one
device, device parallelism's shared part) lives here. Adding a strategy is
adding its module and one line in STRATEGIES.
"""
import importlib

STRATEGIES = {
    "single-device": "agnostic.strategies.single_device:SingleDeviceStrategy",
    "tf-mirrored": "agnostic.engines.tensorflow.mirrored:TFMirroredStrategy",
    "tf-central-storage": "agnostic.engines.tensorflow.central_storage:TFCentralStorageStrategy",
    "tf-multi-worker": "agnostic.engines.tensorflow.multi_worker:TFMultiWorkerStrategy",
    "jax-data-parallel": "agnostic.engines.jax.data_parallel:JaxDataParallelStrategy",
    "mxnet-context": "agnostic.engines.mxnet.context:MxnetContextStrategy",
    "torch-ddp": "agnostic.engines.torch.ddp:TorchDDPStrategy",
    "tf-device-parallel": "agnostic.engines.tensorflow.device_parallel:TFDeviceParallelStrategy",
    "torch-device-parallel":
        "agnostic.engines.torch.device_parallel:TorchDeviceParallelStrategy",
    "jax-model-parallel": "agnostic.engines.jax.model_parallel:JaxModelParallelStrategy",
    "jax-sharded": "agnostic.engines.jax.sharded:JaxShardedStrategy",
    "torch-sharded": "agnostic.engines.torch.sharded:TorchShardedStrategy",
}


def get(name):
    """The strategy class registered as `name` (imports its module)."""
    try:
        target = STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"Unknown strategy {name!r}. Known: {', '.join(sorted(STRATEGIES))}"
        ) from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)
