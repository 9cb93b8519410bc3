"""One module per strategy; the registry maps Plan.strategy to its class.

Adding an engine is adding a module here and one line in STRATEGIES.
"""
import importlib

STRATEGIES = {
    "single-device": "agnostic.strategies.single_device:SingleDeviceStrategy",
    "tf-mirrored": "agnostic.strategies.tf_mirrored:TFMirroredStrategy",
    "tf-central-storage": "agnostic.strategies.tf_central_storage:TFCentralStorageStrategy",
    "tf-multi-worker": "agnostic.strategies.tf_multi_worker:TFMultiWorkerStrategy",
    "jax-data-parallel": "agnostic.strategies.jax_data_parallel:JaxDataParallelStrategy",
    "mxnet-context": "agnostic.strategies.mxnet_context:MxnetContextStrategy",
    "torch-ddp": "agnostic.strategies.torch_ddp:TorchDDPStrategy",
    "tf-device-parallel": "agnostic.strategies.tf_device_parallel:TFDeviceParallelStrategy",
    "torch-device-parallel":
        "agnostic.strategies.torch_device_parallel:TorchDeviceParallelStrategy",
    "jax-model-parallel": "agnostic.strategies.jax_model_parallel:JaxModelParallelStrategy",
    "jax-sharded": "agnostic.strategies.jax_sharded:JaxShardedStrategy",
    "torch-sharded": "agnostic.strategies.torch_sharded:TorchShardedStrategy",
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
