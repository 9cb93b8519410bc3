"""compat.batch_norm_moments's sum over processes, in a real gloo group of one
process (this one): autograd goes back through it, and torch says nothing
(its torch.distributed.nn.functional.all_reduce, deprecated, warned at every
call of every synchronized BatchNormalization). The whole layer over 2 and 4
processes is tests/test_programs.py's BatchNormalization tests."""
import random
import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from agnostic.compat import batch_norm_moments  # noqa: E402
from agnostic.launch.processes import free_port  # noqa: E402


@pytest.fixture
def group():
    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_sum_goes_back_through_autograd_without_a_warning(group):
    local = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a FutureWarning fails the test
        total = batch_norm_moments._summed(local * 2.0)
        (total * torch.tensor([1.0, 10.0, 100.0])).sum().backward()
    assert total.tolist() == [2.0, 4.0, 6.0]
    assert local.grad.tolist() == [2.0, 20.0, 200.0]


def test_a_symbolic_tensor_sends_nothing(group):
    # Keras's symbolic build calls the moments on torch's "meta" device. A
    # collective there would draw an id from Python's global random, moving
    # the order fit then shuffles a PyDataset's batches in (torch_reduce).
    meta = torch.empty(3, device="meta")
    state = random.getstate()
    assert batch_norm_moments._summed(meta).shape == (3,)
    assert random.getstate() == state
