"""The mode's sum (overrides.sum_dim) returns the dtype torch returns: a bool or integer tensor sums
to int64. It returned the input's dtype, and transformers 5.17's assisted decoding, which computes
`candidate_length - ((...) < 1).sum()`, raised "Subtraction ... with a bool tensor" under the mode."""

import pytest
import torch

from nondet.kernels import batch_invariant

DTYPES = [torch.bool, torch.int32, torch.int64, torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [-1, 0, None])
def test_sum_under_the_mode_has_torchs_dtype_and_value(dtype, dim):
    x = (torch.arange(15).reshape(3, 5) % 3 == 0).to(dtype)
    expected = x.sum() if dim is None else x.sum(dim)
    with batch_invariant():
        got = x.sum() if dim is None else x.sum(dim)
    assert got.dtype == expected.dtype
    assert torch.equal(got, expected)


def test_the_assisted_decoding_match_count_subtracts_under_the_mode():
    candidates, selected = torch.tensor([[4, 7, 9]]), torch.tensor([[4, 7, 1, 2]])
    with batch_invariant():
        n_matches = ((~(candidates == selected[:, :-1])).cumsum(dim=-1) < 1).sum()  # transformers 5.17's line
        assert 3 - n_matches == 1
