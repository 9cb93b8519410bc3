"""torch: when Keras itself trains the processes as one (Keras 3.16).

Keras 3.13-3.15 train each torch process alone: agnostic averages the
gradients and sums the metrics' states across processes. Keras 3.16's torch
trainer wraps the model in DistributedDataParallel once torch.distributed is
initialised (the `ddp_model` attribute every model gets in its __init__) and
sums the metrics' states in `get_metrics_result`: agnostic then adds neither,
or count metrics would come out once per process too high. Keras's wrapper
averages only what goes through its forward: a train_step of the user's own
calls the model itself, so agnostic averages that step's gradients still
(the wrapper's hooks stay idle without its forward).
"""


def keras_is_data_parallel(model):
    """Whether this Keras wraps `model` in DistributedDataParallel and sums
    its metrics across processes itself."""
    return "ddp_model" in vars(model)


def keras_averages_gradients(model):
    """Whether Keras averages the gradients of `model`'s training steps: its
    own wrapper, and the model's class keeps Keras's train_step."""
    import keras

    return keras_is_data_parallel(model) and \
        getattr(type(model), "train_step") is getattr(keras.Model, "train_step")
