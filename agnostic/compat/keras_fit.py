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
