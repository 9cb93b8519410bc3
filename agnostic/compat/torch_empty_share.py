"""torch, Keras 3.13-3.16: a Keras loss over no rows is 0 in a step where
this process's share of the batch is empty (a batch smaller than the
processes: `batch_size=1` on 2, an epoch's last row).

Keras's `losses.loss.reduce_values` returns a loss over no rows as it is,
an empty tensor, which `backward()` refuses ("grad can be implicitly created
only for scalar outputs"): one device never sees an empty batch. In such a
step of a model agnostic compiled, the loss is the sum of those no values
instead: 0, still joined to the model's outputs, so that every weight gets
its (zero) gradient and the processes' reductions stay matched. This holds
for the compiled loss (Keras's own steps) and for a loss object a step of
the program's own calls (`self.loss_fn(y, y_pred)`). The step's weight,
rows / every process's rows, is 0 there anyway (engines.torch.gradients).
Elsewhere Keras's function runs as it is: it is replaced only while such a
step runs (compat/scoped.py).
"""
import contextlib
import threading

from agnostic.compat import scoped, versions

_state = threading.local()


@contextlib.contextmanager
def when(empty):
    """Within: Keras's losses over no rows are 0, if `empty`."""
    previous = getattr(_state, "empty", False)
    _state.empty = bool(empty)
    try:
        with _PATCHES.active():
            yield
    finally:
        _state.empty = previous


def _module():
    """keras.src.losses.loss, where `reduce_values` is, or a CompatError."""
    try:
        from keras.src.losses import loss as module
    except ImportError:
        module = None
    if not callable(getattr(module, "reduce_values", None)):
        raise versions.moved("losses.loss.reduce_values")
    return module


def probe(keras):
    """What the replaced function relies on (agnostic/compat/registry.py):
    Keras's losses reduce through `reduce_values(values, sample_weight,
    reduction)`, looked up in its module, which returns a 1-element loss's
    value (a scalar)."""
    import torch

    reduce_values = _module().reduce_values
    versions.expect(versions.takes(reduce_values, "values", "sample_weight", "reduction"),
                    "keras.src.losses.loss.reduce_values(values, sample_weight, reduction)")
    reduced = reduce_values(torch.tensor([2.0]))
    versions.expect(tuple(reduced.shape) == () and float(reduced) == 2.0,
                    "keras.src.losses.loss.reduce_values returning a 1-element loss's value")


def _replacements():
    yield _module(), "reduce_values", _summed_when_empty


def _summed_when_empty(original):
    def reduce_values(values, *args, **kwargs):
        if getattr(_state, "empty", False) and getattr(values, "shape", None) is not None \
                and 0 in tuple(values.shape):
            return values.sum()
        return original(values, *args, **kwargs)

    return reduce_values


_PATCHES = scoped.Patches(_replacements)
