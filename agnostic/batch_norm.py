"""Batch normalization over the global batch, on every engine.

One device normalises each batch with that batch's mean and variance. Split
over N replicas, each would see only its share: other statistics, other
gradients, other weights, and moving statistics that drift apart. So by
default (`sync_batch_norm=True`) every replica normalises with the
statistics of the whole global batch:

- TensorFlow: Keras's own `BatchNormalization(synchronized=True)`, set on
  the model's layers while it trains (an all-reduce per layer and step;
  saved files keep the layer's own setting);
- torch: the layers' moments summed across processes, through an all-reduce
  that gradients flow back through (torch's SyncBatchNorm semantics);
- JAX: nothing to do, its one program sees the global batch.

With `sync_batch_norm=False` each replica keeps its own batch statistics
(faster: what MirroredStrategy and DistributedDataParallel do by default),
and the moving statistics are averaged, so every replica and process
hold the same ones.
"""


def layers(model):
    """The model's BatchNormalization layers, nested models included."""
    import keras

    found = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            found.append(layer)
        elif hasattr(layer, "layers"):
            found.extend(layers(layer))
    return found


def synchronize(model, synchronized=True):
    """TensorFlow: every BatchNormalization layer of `model` (nested models
    included) normalises over the global batch, or (False) as it was made.
    Its config still says what the program made it with: a saved file
    loads on every engine (only TensorFlow accepts synchronized=True)."""
    import keras

    from agnostic.compat import keras_fit

    for layer in keras_fit.every_layer(model):
        if not isinstance(layer, keras.layers.BatchNormalization):
            continue
        own = layer.__dict__.setdefault("_agnostic_own_synchronized", layer.synchronized)
        layer.synchronized = synchronized or own
        if "get_config" not in layer.__dict__:
            layer.get_config = _as_made(layer.get_config, own)


def _as_made(get_config, own):
    def run():
        config = get_config()
        config["synchronized"] = own
        return config

    return run


def moving_statistics(model):
    """The moving means and variances of the model's batch normalization."""
    return [variable for layer in layers(model)
            for variable in (layer.moving_mean, layer.moving_variance)]
