"""The order in which Keras's fit(shuffle=True) takes an array's samples on
one device, so that several processes can take theirs from the same order.

Keras 3.13-3.15 draw it from a global generator as each epoch starts: torch's
data loader from torch's (a RandomSampler), the NumPy iterator (JAX) from
NumPy's; `keras.utils.set_random_seed` makes it reproducible. Keras 3.16
seeds it by the epoch's number within the fit call: `torch.randperm` with a
generator seeded with it, `numpy.random.default_rng(epoch)`.
"""
import contextlib

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


def probe(keras):
    """That `permutation` is the order Keras's own array adapter gives
    fit(shuffle=True) on this engine (agnostic/compat/registry.py), in its
    first two epochs, for 8 samples: from the same global seed (3.13-3.15,
    whose torch loader draws through a RandomSampler of its own) or seeded
    by the epoch (3.16)."""
    from keras.src.trainers.data_adapters import array_data_adapter

    torch_loader = keras.backend.backend() == "torch"
    adapter = array_data_adapter.ArrayDataAdapter(np.arange(8), batch_size=8, shuffle=True)
    for epoch in (0, 1):
        with _seeded(torch_loader):
            kept = _keras_order(keras, adapter, torch_loader)
        with _seeded(torch_loader):
            ours = permutation(8, epoch)
        versions.expect(np.array_equal(kept, ours),
                        f"fit(shuffle=True)'s order of an array's samples in epoch {epoch}")
        adapter.on_epoch_end()


def _keras_order(keras, adapter, torch_loader):
    """The order of the samples in the adapter's one batch of this epoch."""
    if not torch_loader:
        return np.asarray(keras.tree.flatten(next(iter(adapter.get_jax_iterator())))[0])
    loader = adapter.get_torch_dataloader()
    if (versions.parts(keras.__version__) or (0, 0)) >= SEEDED_BY_EPOCH:
        return np.asarray(keras.tree.flatten(next(iter(loader)))[0])
    sampler = loader.batch_sampler.sampler
    versions.expect(_draws_globally(sampler, adapter.num_batches * adapter.batch_size),
                    "torch's DataLoader of an array shuffled by a RandomSampler with "
                    "torch's global generator")
    return np.fromiter(iter(sampler), dtype=np.int64)


def _draws_globally(sampler, samples):
    import torch

    return (isinstance(sampler, torch.utils.data.RandomSampler)
            and getattr(sampler, "generator", None) is None and len(sampler) == samples)


@contextlib.contextmanager
def _seeded(torch_loader):
    """The global generators seeded alike, and put back as they were."""
    state = np.random.get_state()
    np.random.seed(1)
    if torch_loader:
        import torch

        torch_state = torch.random.get_rng_state()
        torch.manual_seed(1)
    try:
        yield
    finally:
        np.random.set_state(state)
        if torch_loader:
            torch.random.set_rng_state(torch_state)
