"""torch: who makes the processes train as one, Keras or agnostic.

Keras 3.13-3.15 train each torch process alone. Keras 3.16's torch trainer
wraps the model in DistributedDataParallel once torch.distributed is
initialised (the `ddp_model` attribute every model gets in its __init__),
calls the model through it in its own train_step, and sums the metrics'
states in `get_metrics_result`: agnostic then adds neither, or count metrics
would come out once per process too high.

Where Keras does not (3.13-3.15, or a train_step of the user's own, which
calls the model itself), agnostic runs the model's forward pass through
torch's DistributedDataParallel during training steps, as Keras 3.16 does
in its own step: torch's reducer then averages the gradients in buckets
while backward runs. The hook is the model's `forward` (a public
torch.nn.Module method, which Keras's `Layer.__call__` reaches through
torch's `Module.__call__`), replaced on the instance only.
"""
from agnostic import methods
from agnostic.compat import versions


KERAS_DATA_PARALLEL = (3, 16)


def probe(keras):
    """What this module relies on (agnostic/compat/registry.py): Keras
    3.13-3.15 give a model no `ddp_model`; from 3.16 every model has one
    (None until torch.distributed is initialised) and the torch trainer sums
    the metrics in a `get_metrics_result` of its own. And what
    `parallel_forward` calls: `torch_params`, and DistributedDataParallel
    with `device_ids`, `bucket_cap_mb`, `find_unused_parameters`."""
    from torch.nn.parallel import DistributedDataParallel

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    if (versions.parts(keras.__version__) or (0, 0)) >= KERAS_DATA_PARALLEL:
        versions.expect(keras_is_data_parallel(model) and model.ddp_model is None,
                        "Model.ddp_model (the torch trainer's DistributedDataParallel)")
        versions.expect(keras.Model.get_metrics_result.__module__
                        == "keras.src.backend.torch.trainer",
                        "the torch trainer's own get_metrics_result (metrics summed "
                        "across processes)")
    else:
        versions.expect(not keras_is_data_parallel(model),
                        "models without a ddp_model (Keras before 3.16)")
    versions.expect(not methods.own(model, "train_step"), "keras.Model.train_step being Keras's own")
    versions.expect(len(model.torch_params) == 2, "Layer.torch_params (the weights)")
    versions.expect(versions.takes(DistributedDataParallel, "device_ids", "bucket_cap_mb",
                                   "find_unused_parameters"),
                    "torch's DistributedDataParallel(module, device_ids, bucket_cap_mb, "
                    "find_unused_parameters)")


def keras_is_data_parallel(model):
    """Whether this Keras wraps `model` in DistributedDataParallel and sums
    its metrics across processes itself."""
    return "ddp_model" in vars(model)


def who_averages(model):
    """("keras", True) where this Keras averages the gradients of `model`'s
    training steps (its own wrapper, and the model's class keeps Keras's
    train_step); else ("agnostic", whether Keras still sums the metrics)."""
    if not keras_is_data_parallel(model):
        return "agnostic", False
    return ("agnostic" if methods.own(model, "train_step") else "keras"), True


def keras_averages_gradients(model):
    """Whether Keras averages the gradients of `model`'s training steps."""
    return who_averages(model)[0] == "keras"


def parallel_forward(model, bucket_mb, multi_device=False):
    """A DistributedDataParallel over `model`'s weights whose forward is the
    model's own (its class's, not a wrapper on the instance). Construction is a collective (rank 0's
    weights reach every process): every process calls this at the same point,
    once the model is built. `multi_device`: the model's weights are on
    several devices (placed with agnostic.device), which torch wants said
    with no device ids."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    own = type(model).forward.__get__(model)
    model.torch_params  # Keras tracks the weights as torch parameters here

    class Forward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model  # a submodule: its parameters are the weights

        def forward(self, *args, **kwargs):
            return own(*args, **kwargs)

    on_one_gpu = torch.cuda.is_available() and not multi_device
    device_ids = [torch.cuda.current_device()] if on_one_gpu else None
    return DistributedDataParallel(Forward(), device_ids=device_ids, bucket_cap_mb=bucket_mb,
                                   find_unused_parameters=False)
