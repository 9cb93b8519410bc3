"""Batch normalization over the global batch, on every engine.

One device normalises each batch with that batch's mean and variance. Split
over N replicas, each would see only its share: other statistics, other
gradients, other weights, and moving statistics that drift apart. So by
default (`sync_batch_norm=True`) every replica normalises with the
statistics of the whole global batch:

- TensorFlow: Keras's own `BatchNormalization(synchronized=True)` in the
  replica model (an all-reduce per layer and step);
- torch: the layers' moments summed across processes, through an all-reduce
  that gradients flow back through (torch's SyncBatchNorm semantics);
- JAX: nothing to do, its one program sees the global batch.

With `sync_batch_norm=False` each replica keeps its own batch statistics
(faster: what MirroredStrategy and DistributedDataParallel do by default),
and the moving statistics are averaged, so every replica and the template
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


def synchronized_clone(layer):
    """clone_model's clone_function: batch normalization synchronised."""
    import keras

    config = layer.get_config()
    if isinstance(layer, keras.layers.BatchNormalization):
        config["synchronized"] = True
    return layer.__class__.from_config(config)


def moving_statistics(model):
    """The moving means and variances of the model's batch normalization."""
    return [variable for layer in layers(model)
            for variable in (layer.moving_mean, layer.moving_variance)]
