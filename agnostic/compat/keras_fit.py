"""Keras's fit, where agnostic steps into it (Keras 3.13-3.16):

- resuming: fit starts at `model._initial_epoch` when it is set (Keras's own
  BackupAndRestore resumes this way; agnostic's restores inside fit, as
  Keras's does, so fit's `initial_epoch` argument has been read already);
- fit evaluates its validation data with `_use_cached_eval_dataset=True`
  (data fit has prepared, which agnostic must not split again);
- every layer of a model, nested ones included (`_flatten_layers`), to
  reach BatchNormalization layers nested in other models.
"""
from agnostic.compat import versions

FITS_OWN_VALIDATION = "_use_cached_eval_dataset"


def resume_at(model, epoch):
    """The next fit (the one running) starts at `epoch`."""
    if not hasattr(model, "_initial_epoch"):
        raise versions.moved("Trainer._initial_epoch (where fit resumes)")
    model._initial_epoch = epoch


def is_fits_validation(kwargs):
    """Whether an evaluate call is fit's own, on its validation data."""
    return bool(kwargs.get(FITS_OWN_VALIDATION))


def every_layer(model):
    """Every layer under `model`, nested ones included, in a fixed order."""
    if not hasattr(model, "_flatten_layers"):
        raise versions.moved("Layer._flatten_layers")
    return list(model._flatten_layers(include_self=False))


def probe(keras):
    """What this module relies on (agnostic/compat/registry.py): fit reads
    `_initial_epoch` and passes `_use_cached_eval_dataset` to evaluate (read
    from the engine trainer's source), and `_flatten_layers` reaches a
    layer nested in an inner model."""
    import inspect

    inner = keras.Sequential([keras.layers.Dense(2)])
    model = keras.Sequential([inner, keras.layers.Dense(1)])  # unbuilt: no weights made
    resume_at(model, 0)
    fit, evaluate = inspect.getsource(type(model).fit), inspect.getsource(type(model).evaluate)
    versions.expect("self._initial_epoch" in fit, "fit starting at Trainer._initial_epoch")
    versions.expect(FITS_OWN_VALIDATION in fit and FITS_OWN_VALIDATION in evaluate,
                    f"fit evaluating with {FITS_OWN_VALIDATION}=True")
    versions.expect(inner.layers[0] in every_layer(model),
                    "Layer._flatten_layers(include_self=False) reaching nested layers")
