"""The census's allowlist (nondet/kernels/op_kinds.py): the accumulating forms of ops it lists as
moves of values or exact reductions are not row-independent; their plain forms are."""

import torch

from nondet.kernels import op_kinds

aten = torch.ops.aten


def test_a_scatter_that_reduces_is_not_row_independent():
    x, index, src = torch.zeros(2, 4), torch.tensor([[0, 0], [1, 1]]), torch.ones(2, 2)
    assert op_kinds.row_independent(aten.scatter.src, (x, 1, index, src), {}) == "indexing"
    assert op_kinds.row_independent(aten.scatter.reduce, (x, 1, index, src), {"reduce": "add"}) is None
    assert op_kinds.row_independent(aten.scatter_.value_reduce, (x, 1, index, 2.0), {"reduce": "multiply"}) is None


def test_a_weighted_bincount_is_not_an_exact_reduction():
    ids = torch.tensor([0, 1, 1, 3])
    assert op_kinds.row_independent(aten.bincount.default, (ids,), {}) == "exact reduction"
    assert op_kinds.row_independent(aten.bincount.default, (ids, torch.tensor([1, 2, 3, 4])), {}) == "exact reduction"
    assert op_kinds.row_independent(aten.bincount.default, (ids, torch.rand(4)), {}) is None


def test_the_softmax_backward_row_sum_is_not_elementwise():
    y = torch.softmax(torch.rand(2, 4), -1)
    assert op_kinds.row_independent(aten._softmax_backward_data.default, (y, y, -1, torch.float32), {}) is None
