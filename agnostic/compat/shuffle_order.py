"""The order in which Keras's fit(shuffle=True) takes an array's samples on
one device, so that several processes can take theirs from the same order.

Keras 3.13-3.15 draw it from a global generator as each epoch starts: torch's
data loader from torch's (a RandomSampler), the NumPy iterator (JAX) from
NumPy's; `keras.utils.set_random_seed` makes it reproducible. Keras 3.16
seeds it by the epoch's number within the fit call: `torch.randperm` with a
generator seeded with it, `numpy.random.default_rng(epoch)`.
"""
import numpy as np

from agnostic.compat import versions

SEEDED_BY_EPOCH = (3, 16)


def permutation(num_samples, epoch):
    """The samples' order in epoch `epoch` (0 for fit's first) of one fit."""
    import keras

    version = versions.parts(keras.__version__) or (0, 0)
    torch_loader = keras.backend.backend() == "torch"
    if version >= SEEDED_BY_EPOCH:
        if torch_loader:
            import torch

            generator = torch.Generator()
            generator.manual_seed(int(epoch))
            return torch.randperm(num_samples, generator=generator).numpy()
        return np.random.default_rng(epoch).permutation(num_samples)
    if torch_loader:
        import torch

        sampler = torch.utils.data.RandomSampler(range(num_samples))
        return np.fromiter(iter(sampler), dtype=np.int64, count=num_samples)
    return np.random.permutation(num_samples)
