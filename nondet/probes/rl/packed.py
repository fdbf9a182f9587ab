"""Packed sequences on the RL trainer side: several sequences in one row, as trainers pack them.

    row:       [ p0 c0 ......... | p1 c1 ...... | p2 c2 .... ]     one micro-batch, no padding
    positions: [ 0 1 2 ... n0-1  | 0 1 ... n1-1 | 0 1 ...    ]     restart per sequence

transformers (5.x masking_utils) reads packing from position ids when no attention mask is
given and builds a block-diagonal causal mask, so SDPA and eager keep attention within each
sequence. That is the default kernels' path here, unchanged. Under the mode the same mask
reaches the invariant attention (kernels/hf.py registers SDPA's mask builder for it), which
cuts the row back into its sequences (kernels/packed.py), so a packed sequence gets the bits
of its own decode (tests/test_rl.py; on an H100 the uncut row gave 80-87% bit-identical
logprobs at micro-batch 4-8, docs/benchmarks.md).
"""


def packed(rows: list[tuple[int, ...]]) -> tuple[list, list, list[tuple[int, int]]]:
    """(ids [1, total], position ids [1, total], (row 0, offset) of each sequence) of one packed row."""
    ids, positions, places = [], [], []
    for r in rows:
        places.append((0, len(ids)))
        ids += list(r)
        positions += list(range(len(r)))
    return [ids], [positions], places
