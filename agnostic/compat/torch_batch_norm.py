"""torch: BatchNormalization's moments over every process's samples.

Keras 3.13-3.15 compute a BatchNormalization layer's batch statistics in
`BatchNormalization._moments(inputs, mask)` (private), and refuse
`synchronized=True` on torch. This replaces that method on each layer of the
model agnostic trains, for calls without a mask (a masked call keeps the
layer's own statistics, and agnostic warns at compile).
"""
import warnings

from agnostic import batch_norm


def synchronize(model, enabled=True):
    """Every BatchNormalization layer of `model` normalises over the global
    batch (or, not `enabled`, over this process's share again); returns
    whether that is now so for every such layer."""
    found = batch_norm.layers(model)
    for layer in found:
        layer.__dict__.pop("_moments", None)  # compiled before
    if not enabled:
        return not found
    for layer in found:
        if not callable(getattr(layer, "_moments", None)):
            import keras

            raise RuntimeError(
                "agnostic synchronises batch normalization on torch through "
                "BatchNormalization._moments, which Keras "
                f"{keras.__version__} no longer has. Pass sync_batch_norm=False "
                "and report this Keras version to agnostic."
            )
        layer.__dict__["_moments"] = _global_moments(layer, layer._moments)
    return True


def _global_moments(layer, own_moments):
    import torch
    import torch.distributed.nn.functional as distributed

    def moments(inputs, mask):
        if mask is not None:
            warnings.warn(
                f"BatchNormalization layer {layer.name!r} was called with a mask: "
                "agnostic normalises it with this process's share of the batch.",
                UserWarning, stacklevel=2,
            )
            return own_moments(inputs, mask)
        axes = layer._reduction_axes
        count = inputs.numel() // inputs.shape[layer.axis]
        local = torch.cat([
            torch.sum(inputs, dim=axes).reshape(-1),
            torch.sum(torch.square(inputs), dim=axes).reshape(-1),
            torch.full((1,), float(count), dtype=inputs.dtype, device=inputs.device),
        ])
        # An all-reduce that autograd goes back through: each process's
        # gradient then includes what its samples did to the others' losses.
        total = distributed.all_reduce(local)
        channels = (total.shape[0] - 1) // 2
        mean = total[:channels] / total[-1]
        variance = total[channels:2 * channels] / total[-1] - torch.square(mean)
        return mean, variance

    return moments
