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


def fill_sample_weight(given):
    """Adds a sample_weight of ones to a *_on_batch call's arguments where
    this Keras needs one (JAX, before 3.15)."""
    import keras

    if keras.backend.backend() != "jax" or versions.parts(keras.__version__) >= (3, 15):
        return
    if given.get("y") is None or given.get("sample_weight") is not None \
            or given.get("class_weight") is not None:
        return
    samples = batching.num_samples(given.get("x"))
    if samples:
        given["sample_weight"] = np.ones(samples, "float32")
