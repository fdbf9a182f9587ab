"""The pairwise tree that --tp-invariant's reductions follow: ((p0 + p1) + (p2 + p3)) ..., each node an
fp32 add rounded once to the parts' dtype (a rank's partial product is rounded so too).

tp_tree.py (row-parallel linears), tp_experts.py (fused MoE experts) and collective.py (the all-reduce
that continues a rank's subtree across the ranks) all combine with this one function, so every TP
degree computes the same tree. Traced (torch.compile), each node is the opaque nondet::rounded_add
(custom_ops.py), whose rounding Inductor cannot fuse away.
"""

import torch

from nondet.kernels import custom_ops


def pairwise_tree(parts: list[torch.Tensor]) -> torch.Tensor:
    """Combine a power of 2 of same-shape parts pairwise, each node rounded once to their dtype."""
    assert parts and len(parts) & (len(parts) - 1) == 0, "a power of 2 of parts"
    add = torch.ops.nondet.rounded_add if torch.compiler.is_compiling() else custom_ops.rounded_add
    while len(parts) > 1:
        parts = [add(a, b) for a, b in zip(parts[::2], parts[1::2])]
    return parts[0]
