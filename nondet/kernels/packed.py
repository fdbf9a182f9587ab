"""Packed rows: several sequences concatenated in one row, attention kept within each.

Trainers pack a micro-batch into one row (position ids restart per sequence) and transformers
turns that into a block-diagonal causal mask. The invariant attention kernels align their KV
chunks at a row's first key (`kv_start`), one value per batch row; inside a packed row a
sequence starts at some offset, so its keys would fall into chunks cut elsewhere than in its
own decode, and its sums would run in another order (measured on an H100: 80-87% of logprobs
bit-identical at micro-batch 4-8 packed). Cutting the row back into its sequences, each run as
a plain causal call, gives every sequence the bits of its own decode. The CPU path attends over
each query's visible keys alone and needs no cut, but takes the same one.
"""

import torch


def segments(mask: torch.Tensor | None, q_len: int, kv_len: int) -> list[tuple[int, int]] | None:
    """[(start, end), ...] of a one-row block-diagonal causal bool mask with 2+ blocks, else None.

    mask: (1, 1, Q, S) bool (True = attend) with Q == S (no KV cache). Anything else (a plain
    causal mask, padding, a custom pattern) returns None and takes the kernels' usual path.
    """
    if mask is None or mask.dtype != torch.bool or q_len != kv_len or q_len < 2:
        return None
    if mask.dim() != 4 or mask.shape[0] != 1 or mask.shape[1] != 1 or mask.shape[-2:] != (q_len, kv_len):
        return None
    rows = mask[0, 0]
    first = rows.to(torch.int8).argmax(dim=-1)  # first visible key of each query (Q,)
    at = torch.arange(q_len, device=mask.device)
    starts = torch.nonzero(first == at).flatten()  # a sequence starts where a query sees itself first
    if starts.numel() < 2 or int(starts[0]) != 0:
        return None
    start_of = starts[torch.searchsorted(starts, at, right=True) - 1]  # (Q,) the start of each query's block
    expected = (at[None, :] >= start_of[:, None]) & (at[None, :] <= at[:, None])
    if not torch.equal(rows, expected):
        return None
    bounds = starts.tolist() + [q_len]
    return list(zip(bounds[:-1], bounds[1:]))


def per_segment(fn, query, key, value, bounds: list[tuple[int, int]]) -> torch.Tensor:
    """fn(q, k, v) -> (1, q, H, D) on each block of (1, H, Q, D) / (1, KVH, S, D); joined on Q."""
    return torch.cat([fn(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b]) for a, b in bounds], dim=1)
