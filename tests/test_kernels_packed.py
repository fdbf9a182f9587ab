"""packed.segments: which masks are packed rows (cut into sequences) and which are not."""

import types

import torch

from nondet.kernels import hf, ops, packed


def _block_causal(lengths):
    total = sum(lengths)
    mask = torch.zeros(1, 1, total, total, dtype=torch.bool)
    at = 0
    for n in lengths:
        mask[..., at:at + n, at:at + n] = torch.ones(n, n, dtype=torch.bool).tril()
        at += n
    return mask


def test_a_block_diagonal_causal_mask_is_cut_at_each_sequence():
    assert packed.segments(_block_causal([3, 5, 1, 4]), 13, 13) == [(0, 3), (3, 8), (8, 9), (9, 13)]


def test_masks_that_are_not_packed_rows_are_left_alone():
    causal = _block_causal([9])
    assert packed.segments(causal, 9, 9) is None  # one sequence: the plain path
    assert packed.segments(None, 9, 9) is None
    left_padded = causal.clone()
    left_padded[..., :, :2] = False  # a left-padded row: its pad queries see nothing
    assert packed.segments(left_padded, 9, 9) is None
    leaky = _block_causal([4, 5])
    leaky[..., 6, 1] = True  # one query sees into the sequence before it: not block-diagonal
    assert packed.segments(leaky, 9, 9) is None
    two_rows = torch.cat([_block_causal([4, 5])] * 2)
    assert packed.segments(two_rows, 9, 9) is None  # several rows: only one-row packing is cut
    assert packed.segments(_block_causal([4, 5])[..., :8], 9, 8) is None  # keys from a cache
    assert packed.segments(torch.zeros(1, 1, 9, 9).masked_fill(~_block_causal([4, 5]), -1e9), 9, 9) is None


def test_the_mode_attention_runs_a_packed_row_sequence_by_sequence(monkeypatch):
    """The transformers glue takes the cut: each sequence's rows equal that sequence run alone."""
    cuts = []
    real = packed.per_segment
    monkeypatch.setattr(packed, "per_segment", lambda fn, *a: cuts.append(a[-1]) or real(fn, *a))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, h, 21, 8, generator=g, dtype=torch.bfloat16) for h in (4, 2, 2))
    module = types.SimpleNamespace(is_causal=True)
    hf.set_enabled(True)
    try:
        out, _ = hf.attention_forward(module, q, k, v, _block_causal([12, 9]), scaling=0.35)
    finally:
        hf.set_enabled(False)
    assert cuts == [[(0, 12), (12, 21)]]
    alone = ops.attention(q[:, :, 12:], k[:, :, 12:], v[:, :, 12:], None, 0.35, True)
    assert torch.equal(out[:, 12:].view(torch.int16), alone.view(torch.int16))
    first = ops.attention(q[:, :, :12], k[:, :, :12], v[:, :, :12], None, 0.35, True)
    assert torch.equal(out[:, :12].view(torch.int16), first.view(torch.int16))
