"""Batch normalization over the global batch, on every engine.

One device normalises each batch with that batch's mean and variance. Split
over N replicas, each would see only its share: other statistics, other
gradients, other weights, and moving statistics that drift apart. So by
default (`sync_batch_norm=True`) every replica normalises with the
statistics of the whole global batch, computed with the formula the
engine's one-device layer uses (agnostic/compat/batch_norm_moments.py):

- TensorFlow: two passes over the global batch, as `tf.nn.moments` on one
  device (two all-reduces per layer and step; Keras's own
  `synchronized=True` takes one pass, which loses the variance of inputs
  whose mean is large against their spread);
- torch: one pass, as Keras on torch on one device, through one all-reduce
  that gradients flow back through (torch's SyncBatchNorm semantics);
- JAX: nothing to do, its one program sees the global batch.

With `sync_batch_norm=False` each replica keeps its own batch statistics
(faster: what MirroredStrategy and DistributedDataParallel do by default),
and the moving statistics are averaged, so every replica and process
hold the same ones. Either way the layers' configs are as the program made
them.
"""


def layers(model):
    """The model's BatchNormalization layers, nested ones included."""
    import keras

    from agnostic.compat import keras_fit

    return [layer for layer in keras_fit.every_layer(model)
            if isinstance(layer, keras.layers.BatchNormalization)]


def synchronize(model, engine, synchronized=True):
    """Every BatchNormalization layer of `model` (nested ones included)
    normalises over the global batch on `engine` ("tensorflow" or "torch"),
    or (False) as it was made. Returns their moving statistics (as
    `moving_statistics`) and whether every such layer now normalises over
    the global batch."""
    from agnostic.compat import batch_norm_moments

    found = layers(model)
    moving = [variable for layer in found for variable in (layer.moving_mean, layer.moving_variance)]
    return moving, batch_norm_moments.synchronize(found, engine, synchronized)


def moving_statistics(model):
    """The moving means and variances of the model's batch normalization."""
    return [variable for layer in layers(model)
            for variable in (layer.moving_mean, layer.moving_variance)]
