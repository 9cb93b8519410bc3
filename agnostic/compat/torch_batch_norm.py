"""torch: BatchNormalization's moments over every process's samples.

Keras 3.13-3.16 compute a BatchNormalization layer's batch statistics in
`BatchNormalization._moments(inputs, mask)` (private), and refuse
`synchronized=True` on torch. This replaces that method on each layer of the
model agnostic trains, for calls without a mask (a masked call keeps the
layer's own statistics, and agnostic warns at compile).
"""
import functools
import warnings

from agnostic import errors
from agnostic.compat import versions


def synchronize(found, enabled=True):
    """Every BatchNormalization layer in `found` (a model's) normalises over
    the global batch (or, not `enabled`, over this process's share again);
    returns whether that is now so for every such layer."""
    for layer in found:
        layer.__dict__.pop("_moments", None)  # compiled before
    if not enabled:
        return not found
    for layer in found:
        layer.__dict__["_moments"] = _global_moments(layer, _own_moments(layer))
    return True


def _own_moments(layer):
    """The layer's `_moments`, or a CompatError."""
    moments = getattr(layer, "_moments", None)
    if not callable(moments):
        import keras

        raise errors.CompatError(
            "agnostic synchronises batch normalization on torch through "
            "BatchNormalization._moments, which Keras "
            f"{keras.__version__} no longer has. Pass sync_batch_norm=False "
            "and report this Keras version to agnostic."
        )
    return moments


def probe(keras):
    """What the replaced moments rely on (agnostic/compat/registry.py): a
    built layer's `_moments(inputs, mask)` returning the batch's (mean,
    variance), its `_reduction_axes` and `axis`; and torch's all-reduce,
    which _summed (an autograd function) calls both ways."""
    import torch
    import torch.distributed as distributed

    versions.expect(callable(getattr(distributed, "all_reduce", None)),
                    "torch.distributed.all_reduce (torch)")
    layer = keras.layers.BatchNormalization()
    layer.build((None, 3))
    moments = _own_moments(layer)
    versions.expect(versions.takes(moments, "inputs", "mask"),
                    "BatchNormalization._moments(inputs, mask)")
    inputs = torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])
    versions.expect(list(layer._reduction_axes) == [0] and inputs.shape[layer.axis] == 3,
                    "BatchNormalization._reduction_axes and axis (the axes reduced)")
    mean, variance = moments(inputs, None)
    versions.expect(torch.allclose(mean, torch.tensor([2.0, 3.0, 4.0]))
                    and torch.allclose(variance, torch.ones(3)),
                    "BatchNormalization._moments returning the batch's (mean, variance)")


def _global_moments(layer, own_moments):
    import torch

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
        total = _summed(local)
        channels = (total.shape[0] - 1) // 2
        mean = total[:channels] / total[-1]
        variance = total[channels:2 * channels] / total[-1] - torch.square(mean)
        return mean, variance

    return moments


def _summed(local):
    """`local` summed over every process, as an autograd function: each
    process's loss depends on the sum, so the gradient that reaches `local` is
    the sum of every process's gradient of the sum (torch's deprecated
    torch.distributed.nn.functional.all_reduce did the same, with a
    FutureWarning at each call). Tensors on torch's "meta" device (Keras's
    symbolic build) hold no values: nothing is sent for them."""
    return _sum_function().apply(local)


@functools.lru_cache(maxsize=None)
def _sum_function():
    """The autograd function, made once torch is imported."""
    import torch
    import torch.distributed as dist

    def all_reduced(tensor):
        total = tensor.clone(memory_format=torch.contiguous_format)
        if not total.is_meta:
            dist.all_reduce(total)
        return total

    class Sum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, tensor):
            return all_reduced(tensor)

        @staticmethod
        def backward(ctx, gradient):
            return all_reduced(gradient)

    return Sum
