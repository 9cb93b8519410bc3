"""What a layer adds with `add_loss`, kept by the replica that added it
while a step runs over the global batch (agnostic/fit/global_batch.py), Keras
3.13-3.16.

A layer keeps its added losses in one list (`Layer._losses`, private),
shared by every replica of a tf.distribute strategy, whose replicas trace
their steps on threads of their own and take turns at each collective: once
a step gathers in the middle of a call, one replica's call clears or reads
the losses another's added. While such a step runs, each replica keeps its
own, in its thread: `add_loss`, `_get_own_losses` and `_clear_losses` are
replaced then (compat/scoped.py) and act as Keras's elsewhere.
"""
import threading

from agnostic.compat import scoped, versions

_kept = threading.local()


def nested_layers(layer):
    """Every layer inside `layer`, nested ones included (Keras's own walk)."""
    return list(layer._flatten_layers(include_self=False, recursive=True))


def kept():
    """This thread's added losses, by layer id, while a step keeps them."""
    return getattr(_kept, "losses", None)


class Keeping:
    """While open on this thread, the losses layers add are this thread's."""

    def __enter__(self):
        self.previous = kept()
        _kept.losses = {}
        self.scope = _PATCHES.active()
        self.scope.__enter__()
        return _kept.losses

    def __exit__(self, *details):
        try:
            return self.scope.__exit__(*details)
        finally:
            _kept.losses = self.previous


def _add_loss(add_loss):
    def run(self, loss):
        losses = kept()
        if losses is None:
            return add_loss(self, loss)
        import keras

        losses.setdefault(id(self), []).extend(keras.tree.flatten(loss))

    return run


def _get_own_losses(get_own_losses):
    def run(self):
        losses = kept()
        return get_own_losses(self) if losses is None else list(losses.get(id(self), []))

    return run


def _clear_losses(clear_losses):
    def run(self):
        losses = kept()
        if losses is None:
            return clear_losses(self)
        losses.pop(id(self), None)
        for layer in self._layers:
            layer._clear_losses()

    return run


def _replacements():
    from keras.src.layers import layer

    yield layer.Layer, "add_loss", _add_loss
    yield layer.Layer, "_get_own_losses", _get_own_losses
    yield layer.Layer, "_clear_losses", _clear_losses


_PATCHES = scoped.Patches(_replacements)


def probe(keras):
    """Layers keep their added losses through `add_loss`, `_get_own_losses`
    (what `losses` reads) and `_clear_losses`, and a model's `losses` reads
    its layers' through `_get_own_losses`."""
    from keras.src.layers import layer

    for name in ("add_loss", "_get_own_losses", "_clear_losses"):
        versions.expect(callable(getattr(layer.Layer, name, None)), f"Layer.{name}")
    versions.expect(isinstance(getattr(keras.layers.Dense(1), "_layers", None), list),
                    "Layer._layers (a layer's sublayers)")
    inner = keras.layers.Dense(1)
    outer = keras.Sequential([keras.Input((2,)), inner])
    versions.expect(inner in nested_layers(outer),
                    "Layer._flatten_layers(include_self=False, recursive=True)")
    import inspect

    source = inspect.getsource(layer.Layer.losses.fget)
    versions.expect("_get_own_losses()" in source,
                    "Layer.losses reading each layer's _get_own_losses()")
