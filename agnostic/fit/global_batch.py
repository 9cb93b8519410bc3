"""One device's view of a step, on engines that run a program per replica
(TensorFlow's strategies, torch's processes).

JAX trains like one device for any program because its one program sees
the global batch. Here every replica runs the step over the global batch
too: the step's data are gathered across the replicas, so whatever the step
computes from it (the losses of any form, the metrics, a step of the
program's own, random draws shaped by the batch) is one device's, on every
replica alike. A layer that draws for its rows in its call (Dropout, a
VAE's sampling layer) draws for all the rows and keeps its part
(compat/random_draws.py). Only the work that costs is shared: each layer or model the
step calls (the model itself, a GAN's generator) runs on this replica's part
of the rows it is given and its outputs are gathered back.

Every replica then computes the same loss from the same values, so the
gradient of a gathered output is the same on every replica: the gather's
backward pass takes this replica's part of it, N times (no collective), and
the weights' gradients are averaged over the replicas (N times the data's
part, summed over the replicas, and N copies of what does not depend on the
batch, such as a regularizer: each divided by N, one device's gradient).
Where a call's inputs need a gradient themselves (a GAN's generated images
reaching its discriminator, a gradient penalty), the backward pass of taking
a part gathers the parts' gradients back, divided by N, so the input's
gradient is one device's on every replica.

What a call adds with `add_loss` is this replica's part's: its value becomes
the sum over the replicas of each one's weighted by its rows (one device's
for the means over rows Keras's and the guides' layers add), and its
gradient this replica's, weighted so (no collective in the backward pass).

An engine supplies a `View` for each step (engines/tensorflow/batch_view.py,
engines/torch/batch_view.py) with: `replicas`, `gather_data(values)`,
`split(rows)` -> (start, stop), `part(value, start, stop)`,
`gather(value, start, stop, rows)`, `rows(value)`, `leading(value)` (the static or known
leading dimension), `is_tensor(value)`, `weighted_sum(value, start, stop, rows)`,
and for random draws in a call (compat/random_draws.py) `when_rows(rows,
part_rows, if_equal, otherwise)`, `noise_shape(inputs, noise_shape)`,
`ones(shape, like)`.
"""
import threading

from agnostic import methods
from agnostic.compat import layer_losses, random_draws

_step = threading.local()  # TensorFlow's replicas trace their steps on threads of their own

STEPS = ("train_step", "test_step")


def see_the_global_batch(model, make_view):
    """`model`'s train_step and test_step run on the global batch (each
    replica alike); the layers they call share the work. `make_view()`
    gives the engine's View in a step. Returns the wraps that do it,
    (owner, method name, wrapper) triples for methods.wrap_all."""
    def wrapper(step):
        def run(data, *args, **kwargs):
            view = make_view()
            if view is None:
                return step(data, *args, **kwargs)
            previous = getattr(_step, "view", None), getattr(_step, "depth", 0)
            _step.view, _step.depth = view, 0
            try:
                with layer_losses.Keeping(), random_draws.drawing():
                    return step(view.gather_data(data), *args, **kwargs)
            finally:
                _step.view, _step.depth = previous

        return run

    layers = _callable_layers(model)
    # Unwrapped when the model is compiled again (methods.start_again).
    model.__dict__[methods.WRAPPED_LAYERS] = methods.Held(
        [layer for layer in layers if layer is not model])
    return [(model, name, wrapper) for name in STEPS] + [
        (layer, "call", _shared_call(layer)) for layer in layers]


def active():
    """This thread's View, while a global step runs; else None."""
    return getattr(_step, "view", None)


def _callable_layers(model):
    """The model and every layer a step may call: its layers, nested ones
    included, and layers it holds as attributes (a GAN's two models)."""
    import keras

    found = [model]
    held = [value for value in vars(model).values() if isinstance(value, keras.layers.Layer)]
    for layer in [model] + held:
        found += [layer] + layer_losses.nested_layers(layer)
    return methods.unique(found)


def _shared_call(layer):
    """`layer.call`, called by the step itself (not from inside another
    layer's call) on rows of the batch: run on this replica's part of the
    rows, its outputs gathered."""
    def wrapper(call):
        def run(*args, **kwargs):
            view = active()
            if view is None or _step.depth:
                return call(*args, **kwargs)
            import keras

            first = next((value for value in keras.tree.flatten((args, kwargs))
                          if view.is_tensor(value) and _rank(value)), None)
            if first is None:
                return call(*args, **kwargs)
            rows, total = view.leading(first), view.rows(first)
            start, stop = view.split(total)

            def part(value):
                if view.is_tensor(value) and _rank(value) and view.leading(value) == rows:
                    return view.part(value, start, stop)
                return value

            args, kwargs = keras.tree.map_structure(part, (args, kwargs))
            share = next(view.leading(value) for value in keras.tree.flatten((args, kwargs))
                         if view.is_tensor(value) and _rank(value))  # `first`'s part
            counted = _loss_counts()
            _step.depth += 1
            try:
                with random_draws.Drawing(view, start, stop, total):
                    outputs = call(*args, **kwargs)
            finally:
                _step.depth -= 1
            _combine_added_losses(counted, view, start, stop, total)

            def gathered(value):
                if view.is_tensor(value) and _rank(value) and view.leading(value) == share:
                    return view.gather(value, start, stop, total)
                return value

            return keras.tree.map_structure(gathered, outputs)

        return run

    return wrapper


def _rank(value):
    shape = getattr(value, "shape", None)
    return len(shape) if shape is not None else 0


def _loss_counts():
    """How many losses each layer has added so far in this replica's step."""
    return {key: len(losses) for key, losses in layer_losses.kept().items()}


def _combine_added_losses(counted, view, start, stop, total):
    """What the call added with `add_loss` (on this replica's rows; only
    the layers inside the call add on this thread meanwhile): the sum over
    the replicas of each one's, weighted by its part of the rows."""
    for key, losses in layer_losses.kept().items():
        before = counted.get(key, 0)
        if len(losses) > before:
            losses[before:] = [view.weighted_sum(loss, start, stop, total)
                               for loss in losses[before:]]
