"""Global batches must split evenly over the replicas (no engine needed)."""
import numpy as np
import pytest

import agnostic
from agnostic import batching


def test_even_batches_pass_and_a_last_batch_that_does_not_split_is_refused():
    assert batching.check_split("fit", 96, 16, 4) is None
    assert batching.check_split("fit", 101, 16, 1) is None  # one replica takes any batch
    with pytest.raises(agnostic.BatchSplitError, match="leave a last batch of 1 samples"):
        batching.check_split("fit", 97, 16, 4)


def test_batch_size_not_a_multiple_of_replicas():
    with pytest.raises(agnostic.BatchSplitError,
                       match=r"batch_size=30 .* not a multiple of 4\. .* batch_size=28"):
        batching.check_split("fit", 120, 30, 4)


def test_last_batch_that_cannot_be_split_names_numbers_and_fix():
    with pytest.raises(agnostic.BatchSplitError) as raised:
        batching.check_split("fit", 101, 16, 2)
    message = str(raised.value)
    assert "101 samples with batch_size=16 leave a last batch of 5 samples" in message
    assert "a multiple of 2, such as 100 (x[:100], y[:100])" in message


def test_any_sample_count_that_is_a_multiple_of_the_replicas_splits():
    # B is a multiple of R, so the last batch is a multiple of R exactly when
    # the sample count is: that is the fix the error names.
    for samples in range(64, 200, 4):
        assert batching.check_split("fit", samples, 24, 4) is None
        for more in (1, 2, 3):  # not a multiple of 4: nor is the last batch
            with pytest.raises(agnostic.BatchSplitError):
                batching.check_split("fit", samples + more, 24, 4)


def test_check_call_reads_fit_arguments():
    def fit(x=None, y=None, batch_size=None, epochs=1, validation_split=0.0,
            validation_data=None, steps_per_epoch=None, validation_batch_size=None):
        pass

    x = np.zeros((64, 3))
    batching.check_call("fit", fit, 2, (x, x), {"batch_size": 16})
    with pytest.raises(agnostic.BatchSplitError, match="validation_data"):
        batching.check_call("fit", fit, 2, (x, x),
                            {"batch_size": 16, "validation_data": (x[:5], x[:5])})
    with pytest.raises(agnostic.BatchSplitError, match="validation_split"):
        batching.check_call("fit", fit, 4, ({"a": x},), {"batch_size": 16,
                                                        "validation_split": 0.1})


def test_unknown_sizes_are_not_checked():
    assert batching.num_samples(iter([1, 2])) is None
    assert batching.num_samples({"a": np.zeros((7, 2))}) == 7
    batching.check_split("fit", None, 3, 2)
