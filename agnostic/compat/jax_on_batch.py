"""JAX on Keras 3.13 and 3.14: `train_on_batch` and `test_on_batch` under a
keras.distribution without a sample_weight.

Those versions give every element of (x, y, sample_weight) a data layout,
None included, and fail ("'NoneType' object has no attribute 'shape'");
Keras 3.15 skips None. There, a sample_weight of ones is passed instead:
the same loss and the same metrics, weighted by one each.
"""
import numpy as np

from agnostic import batching
from agnostic.compat import versions


FILLED_BEFORE = (3, 15)


def probe(keras):
    """What the filled call relies on (agnostic/compat/registry.py): on the
    versions it applies to (JAX, Keras before 3.15), `train_on_batch` and
    `test_on_batch` take a `sample_weight` (and train_on_batch a
    `class_weight`, which it checks)."""
    versions.expect(versions.takes(keras.Model.train_on_batch, "x", "y", "sample_weight",
                                   "class_weight"),
                    "Model.train_on_batch(x, y, sample_weight, class_weight)")
    versions.expect(versions.takes(keras.Model.test_on_batch, "x", "y", "sample_weight"),
                    "Model.test_on_batch(x, y, sample_weight)")


def fill_sample_weight(given):
    """Adds a sample_weight of ones to a *_on_batch call's arguments where
    this Keras needs one (JAX, before 3.15)."""
    import keras

    if keras.backend.backend() != "jax" or versions.parts(keras.__version__) >= FILLED_BEFORE:
        return
    if given.get("y") is None or given.get("sample_weight") is not None \
            or given.get("class_weight") is not None:
        return
    samples = batching.num_samples(given.get("x"))
    if samples:
        given["sample_weight"] = np.ones(samples, "float32")
