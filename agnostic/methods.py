"""Patching one object's methods, on that instance only (a model, its
optimizer, a metric): what the strategies and the compat layer wrap, and
how compiling again starts clean. Imports nothing of agnostic's."""
import functools

# The model's key for the other objects whose methods were wrapped for it.
WRAPPED_LAYERS = "_agnostic_wrapped_layers"
# The model's key for what undoes other changes a strategy made to it.
UNDO = "_agnostic_undo"


def wrap_method(model, name, wrapper):
    """Replaces `model.name` on this instance by `wrapper(original)`;
    `unwrap(model)` puts back what was there before agnostic."""
    original = getattr(model, name)
    originals = model.__dict__.setdefault("_agnostic_originals", {})
    originals.setdefault(name, model.__dict__.get(name))  # None: the class's
    setattr(model, name, functools.wraps(original)(wrapper(original)))


def wrap_all(wraps):
    """Applies `wraps`, (owner, method name, wrapper) triples, in order
    (each one wraps what the ones before left): a strategy's wrappers,
    gathered from its parts, applied in one place."""
    for owner, name, wrapper in wraps:
        wrap_method(owner, name, wrapper)


def unwrap(model):
    """Undoes every wrap_method on `model` (compiling again starts clean)."""
    for name, original in model.__dict__.pop("_agnostic_originals", {}).items():
        if original is None:
            model.__dict__.pop(name, None)
        else:
            setattr(model, name, original)


def start_again(model, again=None):
    """`model` without the wrappers of an earlier backend_agnostic_compile
    (fine-tuning: freeze layers, compile again), which would otherwise apply
    twice; its weights, flags and state are its own throughout. `again`: what
    a later `model.compile(...)` of the program's runs instead, given the
    model and compile's arguments (Keras's compile stays `original(model,
    "compile")`)."""
    for undo in model.__dict__.pop(UNDO, Held([])).values:
        undo()
    for layer in model.__dict__.pop(WRAPPED_LAYERS, Held([])).values:
        unwrap(layer)
    unwrap(model)
    optimizers = [value for value in vars(model).values()
                  if "_agnostic_originals" in getattr(value, "__dict__", {})]
    for optimizer in optimizers + [getattr(o, "inner_optimizer", None) for o in optimizers]:
        if optimizer is not None:
            unwrap(optimizer)
    if again is not None:
        wrap_method(model, "compile", lambda compile: functools.partial(again, model))
    return model


def original(owner, name):
    """`owner.name` as it was before agnostic wrapped it."""
    originals = owner.__dict__.get("_agnostic_originals", {})
    if name not in originals:
        return getattr(owner, name)
    if originals[name] is None:  # the class's
        return getattr(type(owner), name).__get__(owner)
    return originals[name]


def around_saves(model, context):
    """The wraps (for wrap_all) by which `model.save` and `model.save_weights`
    run within `context()`, on every process (a split model: every process
    gathers, the chief writes)."""
    def wrapper(save):
        def run(*args, **kwargs):
            with context():
                return save(*args, **kwargs)

        return run

    return [(model, name, wrapper) for name in ("save", "save_weights") if hasattr(model, name)]


def own(model, name):
    """Whether `model`'s class has a method `name` of its own (a train_step,
    a test_step), not keras.Model's."""
    import keras

    return getattr(type(model), name) is not getattr(keras.Model, name)


class Held:
    """Objects a model holds for agnostic, out of Keras's sight (Keras
    saves and tracks the layers it finds in a model's lists)."""

    def __init__(self, values):
        self.values = values


def unique(values):
    """`values` without None and without repeats (by identity), in order."""
    seen, kept = set(), []
    for value in values:
        if value is not None and id(value) not in seen:
            seen.add(id(value))
            kept.append(value)
    return kept
