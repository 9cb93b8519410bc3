"""BatchNormalization's moments over the global batch, with one device's
formula, on TensorFlow and torch.

Keras 3.13-3.16 compute a BatchNormalization layer's batch statistics in
`BatchNormalization._moments(inputs, mask)` (private). This replaces that
method on each layer of the model agnostic trains, for calls without a mask
(a masked call keeps the layer's own statistics, with a warning). Each
engine keeps the formula its own one-device layer uses, so that N devices
compute what one device computes, up to the order of the sums:

- TensorFlow: two passes, as `tf.nn.moments` (one device's Keras) does: the
  global mean first, then each replica's sum of squared deviations from it,
  summed. Keras's own `synchronized=True` takes one pass, E[x²] - E[x]²,
  which loses the variance where the mean is large against the spread
  (inputs around 1000 with a spread of 0.05: 0 in float32, against one
  device's 0.0025).
- torch: one pass, E[x²] - E[x]², which is what Keras on torch computes on
  one device; one all-reduce of the sums, the squares' sums and the count.

Both go back through autograd: each replica's gradient includes what its
samples did to the others' statistics (torch's SyncBatchNorm semantics).
"""
import functools
import warnings

from agnostic import errors
from agnostic.compat import versions


def synchronize(found, engine, enabled=True):
    """Every BatchNormalization layer in `found` (a model's) normalises over
    the global batch (or, not `enabled`, as it was made again); returns
    whether that is now so for every such layer. `engine`: "tensorflow" or
    "torch"."""
    for layer in found:
        layer.__dict__.pop("_moments", None)  # compiled before
    if not enabled:
        return not found
    formula = {"tensorflow": _tf_moments, "torch": _torch_moments}[engine]
    for layer in found:
        layer.__dict__["_moments"] = _global_moments(layer, _own_moments(layer), formula)
    return True


def _own_moments(layer):
    """The layer's `_moments`, or a CompatError."""
    moments = getattr(layer, "_moments", None)
    if not callable(moments):
        import keras

        raise errors.CompatError(
            "agnostic synchronises batch normalization through "
            "BatchNormalization._moments, which Keras "
            f"{keras.__version__} no longer has. Pass sync_batch_norm=False "
            "and report this Keras version to agnostic."
        )
    return moments


def probe(keras):
    """What the replaced moments rely on (agnostic/compat/registry.py): a
    built layer's `_moments(inputs, mask)` returning the batch's (mean,
    variance) and its `_reduction_axes`; on torch, the all-reduce that
    _summed (an autograd function) calls both ways."""
    import numpy

    if keras.backend.backend() == "torch":
        import torch.distributed as distributed

        versions.expect(callable(getattr(distributed, "all_reduce", None)),
                        "torch.distributed.all_reduce (torch)")
    layer = keras.layers.BatchNormalization()
    layer.build((None, 3))
    moments = _own_moments(layer)
    versions.expect(versions.takes(moments, "inputs", "mask"),
                    "BatchNormalization._moments(inputs, mask)")
    versions.expect(list(layer._reduction_axes) == [0],
                    "BatchNormalization._reduction_axes (the axes reduced)")
    inputs = keras.ops.convert_to_tensor(numpy.array([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]]),
                                         dtype="float32")
    mean, variance = (keras.ops.convert_to_numpy(value) for value in moments(inputs, None))
    versions.expect(numpy.allclose(mean, [2.0, 3.0, 4.0]) and numpy.allclose(variance, 1.0),
                    "BatchNormalization._moments returning the batch's (mean, variance)")


def _global_moments(layer, own_moments, formula):
    def moments(inputs, mask):
        if mask is not None:
            warnings.warn(
                f"BatchNormalization layer {layer.name!r} was called with a mask: "
                "agnostic normalises it with this replica's share of the batch.",
                UserWarning, stacklevel=2,
            )
            return own_moments(inputs, mask)
        return formula(inputs, list(layer._reduction_axes))

    return moments


def _tf_moments(inputs, axes):
    """tf.nn.moments over every replica's rows: (mean, variance) per channel."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None:  # cross-replica (a symbolic build): no rows to share
        return tf.nn.moments(inputs, axes)
    made = inputs.dtype
    x = tf.cast(inputs, tf.float32) if made in (tf.float16, tf.bfloat16) else inputs
    shape = tf.shape(x)
    count = tf.cast(tf.reduce_prod(tf.gather(shape, axes)), x.dtype)
    total = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.concat(
        [tf.reshape(tf.reduce_sum(x, axes), [-1]), tf.reshape(count, [1])], 0))
    mean = tf.math.divide_no_nan(total[:-1], total[-1])
    kept = [1 if axis in axes else -1 for axis in range(len(x.shape))]
    deviations = tf.reduce_sum(
        tf.math.squared_difference(x, tf.stop_gradient(tf.reshape(mean, kept))), axes)
    variance = tf.math.divide_no_nan(
        context.all_reduce(tf.distribute.ReduceOp.SUM, deviations), total[-1])
    if made != x.dtype:  # as Keras does for float16: clipped, then cast back
        low, high = tf.float16.min, tf.float16.max
        mean = tf.cast(tf.clip_by_value(mean, low, high), made)
        variance = tf.cast(tf.clip_by_value(variance, low, high), made)
    return mean, variance


def _torch_moments(inputs, axes):
    """Keras on torch's one-pass moments over every process's rows."""
    import torch

    made = inputs.dtype
    x = inputs.float() if made == torch.float16 else inputs
    count = x.numel() // max(1, _channels(x, axes))
    local = torch.cat([
        torch.sum(x, dim=axes).reshape(-1),
        torch.sum(torch.square(x), dim=axes).reshape(-1),
        torch.full((1,), float(count), dtype=x.dtype, device=x.device),
    ])
    total = _summed(local)
    channels = (total.shape[0] - 1) // 2
    mean = total[:channels] / total[-1]
    variance = total[channels:2 * channels] / total[-1] - torch.square(mean)
    if made != x.dtype:
        limit = torch.finfo(torch.float16).max
        mean = torch.clip(mean, -limit, limit).to(made)
        variance = torch.clip(variance, -limit, limit).to(made)
    return mean, variance


def _channels(x, axes):
    channels = 1
    for axis, size in enumerate(x.shape):
        if axis not in axes:
            channels *= size
    return channels


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
