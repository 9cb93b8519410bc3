"""Keras's train function inside fit, where agnostic steps in (Keras 3.13-3.16):

- fit makes `model.train_function` before `on_train_begin` and calls it
  once per step (per `steps_per_execution` steps) through the attribute,
  so a callback can wrap it for the rest of that fit;
- torch's is given the batch fit took (`train_function(data)`);
  TensorFlow's an iterator it takes its batches from (`get_next()`, or
  `next()` for a Python one); JAX's `(state, iterator)`, returning
  `(logs, state)`.

agnostic wraps it to resume in the middle of an epoch (the first `skip`
batches of the resumed epoch are taken from the data and not trained: the
rest come in the same order as in the interrupted run, where the order does
not depend on the run: see the README) and to stop, after a step, where
every process agreed to (agnostic/resume/preemption.py).
"""
from agnostic.compat import versions


# How each engine's fit calls the train function, in its source.
CALLS = {"tensorflow": "self.train_function(iterator)",
         "jax": "self.train_function(state, iterator)",
         "torch": "self.train_function(data)"}


def probe(keras):
    """What the wrapper relies on (agnostic/compat/registry.py), read from
    the engine trainer's fit (no model trains here): it makes the train
    function before `on_train_begin` and calls it through the attribute,
    with the arguments `_skipped` takes its batches from."""
    import inspect

    model = keras.Sequential([keras.layers.Dense(1)])
    versions.expect("train_function" in vars(model) and hasattr(model, "steps_per_execution"),
                    "Model.train_function and Model.steps_per_execution")
    fit = inspect.getsource(type(model).fit)
    made, begun = fit.find("self.make_train_function()"), fit.find("callbacks.on_train_begin()")
    versions.expect(0 <= made < begun, "fit making train_function before on_train_begin")
    call = CALLS[keras.backend.backend()]
    versions.expect(call in fit, f"fit calling {call}")


def wrap(model, watch):
    """Wraps `model.train_function` for this fit; returns the function that
    puts the original back."""
    import keras

    original = getattr(model, "train_function", None)
    if original is None:
        raise AttributeError("Keras's fit made no train_function before on_train_begin")
    backend = keras.backend.backend()
    per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))

    def run(*args):
        watch.skipped = watch.skip > 0
        if watch.skipped:
            taken = min(per_call, watch.skip)
            watch.skip -= taken
            return _skipped(backend, args, taken)
        logs = original(*args)
        watch.after_step(model)
        return logs

    model.train_function = run

    def unwrap():
        if model.__dict__.get("train_function") is run:
            model.train_function = original

    return unwrap


def _skipped(backend, args, batches):
    """What a skipped call returns, having taken its batches from the data."""
    if backend == "torch":
        return {}  # fit took the batch already
    iterator = args[1] if backend == "jax" else args[0]
    for _ in range(batches):
        if hasattr(iterator, "get_next"):
            iterator.get_next()
        else:
            next(iterator)
    return ({}, args[0]) if backend == "jax" else {}
