"""Random numbers a layer draws for its rows, one device's under the global
view (agnostic/fit/global_batch.py), Keras 3.13-3.16 on TensorFlow and torch.

In a step over the global batch, each layer the step calls runs on this
replica's part of the rows: a draw shaped by those rows (Dropout's mask, a
VAE's epsilon, an augmentation layer's flips) would be a draw for the part.
While such a call runs, the engine's `normal`, `uniform`, `truncated_normal`,
`randint` and `dropout` (keras.src.backend.<engine>.random, private module
functions every Keras draw goes through) draw for all the rows instead,
with the same seed, and keep this replica's part: what one device draws for
those rows. A draw whose first dimension is not the part's rows is left as
it is. The seed is drawn once (a SeedGenerator advances once per draw, as
on one device).
"""
import functools
import threading

from agnostic.compat import scoped, versions

_call = threading.local()
DRAWS = ("normal", "uniform", "truncated_normal", "randint")


class Drawing:
    """While open on this thread, draws are for `rows` rows, of which this
    replica's are [start, stop) (`view`: the engine's, global_batch.py;
    None: draws as they are)."""

    def __init__(self, view, start, stop, rows):
        self.rows = view, start, stop, rows

    def __enter__(self):
        self.previous = getattr(_call, "rows", None)
        _call.rows = self.rows if self.rows[0] is not None else None

    def __exit__(self, *details):
        _call.rows = self.previous


def drawing():
    """Draws in this thread's steps keep one device's numbers (scoped.py)."""
    return _PATCHES.active()


def _drawn(draw):
    def run(shape, *args, seed=None, **kwargs):
        rows = getattr(_call, "rows", None)
        if rows is None or not isinstance(shape, (tuple, list)) or not shape:
            return draw(shape, *args, seed=seed, **kwargs)
        view, start, stop, total = rows
        shape, seed = tuple(shape), _drawn_once(seed)
        with Drawing(None, None, None, None):  # the engine's own draws inside: as they are
            return view.when_rows(
                shape[0], stop - start,
                lambda: draw((total,) + shape[1:], *args, seed=seed, **kwargs)[start:stop],
                lambda: draw(shape, *args, seed=seed, **kwargs))

    return run


def _dropout(dropout):
    """Dropout's mask for all the rows, this replica's part of it kept: one
    device's mask, applied to this replica's rows."""
    def run(inputs, rate, noise_shape=None, seed=None):
        rows = getattr(_call, "rows", None)
        if rows is None or seed is None or rate in (0.0, 1.0):
            return dropout(inputs, rate, noise_shape=noise_shape, seed=seed)
        view, start, stop, total = rows
        shape, seed = view.noise_shape(inputs, noise_shape), _drawn_once(seed)

        def for_every_row():
            ones = view.ones((total,) + tuple(shape[1:]), inputs)
            return inputs * dropout(ones, rate, seed=seed)[start:stop]

        with Drawing(None, None, None, None):
            return view.when_rows(
                shape[0], stop - start, for_every_row,
                lambda: dropout(inputs, rate, noise_shape=noise_shape, seed=seed))

    return run


def _drawn_once(seed):
    """`seed` drawn once, as a SeedGenerator from which each later draw gets
    that same seed (the engine's draws take a SeedGenerator, an int or None:
    a SeedGenerator advances at each draw, and both ways to draw need it)."""
    from keras.src.random import seed_generator

    if not isinstance(seed, seed_generator.SeedGenerator):
        return seed
    drawn = object.__new__(_drawn_type())
    drawn.value, drawn._initial_seed = seed_generator.draw_seed(seed), seed._initial_seed
    return drawn


@functools.lru_cache(maxsize=None)
def _drawn_type():
    from keras.src.random import seed_generator

    class Drawn(seed_generator.SeedGenerator):
        """A seed drawn already: the same one for every draw (made without
        SeedGenerator.__init__, which would make a variable)."""

        def next(self, ordered=True):
            return self.value

    return Drawn


def _replacements():
    from keras.src import backend

    for name in DRAWS:
        yield backend.random, name, _drawn
    yield backend.random, "dropout", _dropout


_PATCHES = scoped.Patches(_replacements)


def generator_states(layers):
    """The state variables of the SeedGenerators the `layers` hold (a
    layer's private `_seed_generators`): they advance alike on every replica
    (agnostic/fit/layer_state.py leaves them out)."""
    return [generator.state for layer in layers
            for generator in getattr(layer, "_seed_generators", ())]


def probe(keras):
    """The engine's random module has the draws, taking a shape and a
    `seed`, and `dropout(inputs, rate, noise_shape, seed)`; draw_seed takes
    a SeedGenerator by its `next`; a layer lists its SeedGenerators."""
    import inspect

    from keras.src import backend
    from keras.src.random import seed_generator

    for name in DRAWS:
        versions.expect(versions.takes(getattr(backend.random, name, None), "shape", "seed"),
                        f"keras.src.backend.random.{name}(shape, ..., seed)")
    versions.expect(versions.takes(getattr(backend.random, "dropout", None), "inputs", "rate",
                                   "noise_shape", "seed"),
                    "keras.src.backend.random.dropout(inputs, rate, noise_shape, seed)")
    versions.expect("seed.next()" in inspect.getsource(seed_generator.draw_seed),
                    "keras.src.random.seed_generator.draw_seed calling SeedGenerator.next()")
    dropout = keras.layers.Dropout(0.5, seed=1)
    versions.expect(generator_states([dropout]) == [dropout.seed_generator.state],
                    "Layer._seed_generators holding a layer's SeedGenerators")
