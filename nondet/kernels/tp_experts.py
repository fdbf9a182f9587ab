"""TP-invariance for fused MoE experts: their down projection reduces its K as tp_tree's fixed tree.

transformers 5 stores an MoE layer's experts as 3-D parameters of one module (Qwen3-MoE:
gate_up_proj (E, 2I, H), down_proj (E, H, I)). Its tensor-parallel plan shards gate_up_proj by
columns (each rank: its slice of the gate and of the up rows, [gate_r; up_r]) and down_proj by
rows (its K, the intermediate I, split over the ranks); the experts module's output, each rank's
partial sum over its I slice, is all-reduced. So the same K split as a row-parallel linear, inside
the experts: the mode alone leaves TP2 off TP1 there too.

Here the experts' forward is cut along I into `leaves` equal chunks (tp_tree's leaves): leaf i is
the whole experts computation of the mode (route, gate, down, weighted fp32 sum over a token's
experts, cast once to the dtype) restricted to chunk i, i.e. on a view of the module whose gate_up
holds chunk i of the gate and of the up rows and whose down_proj holds chunk i of its columns. The
leaves are combined by rounded_tree.pairwise_tree, and a rank at degree d computes leaves/d adjacent
leaves of its own slice, so every degree computes the same tree (the collective continues it).

Cost: each leaf's view copies its slices of the experts' weights on every call (one more read and
write of them a step); --tp-invariant is for proving TP1 == TP2, not for speed.

Layouts covered: concatenated [gate; up] (or up_proj alone), not transposed, no bias, no norm after
the expert; tp_tree.uncovered_reason names what else a plan shards row-wise in an experts module, so
--tp-invariant refuses it in one line instead of running it outside the tree.
"""

import torch

from nondet.kernels.rounded_tree import pairwise_tree

_STATE = {"leaves": 0}  # leaves of the experts call in progress (0: no tree)


def set_leaves(leaves: int) -> None:
    _STATE["leaves"] = leaves


def leaves() -> int:
    return _STATE["leaves"]


class LeafView:
    """The experts module restricted to chunk `index` of `count` along its intermediate dim: every
    attribute is the module's, except the sliced projection weights (copies, contiguous)."""

    def __init__(self, module, index: int, count: int):
        self._module = module
        down = _local(module.down_proj)  # (E, H, I_local)
        width = down.shape[-1] // count
        cols = slice(index * width, (index + 1) * width)
        self.down_proj = down[:, :, cols].contiguous()
        if getattr(module, "has_gate", True):
            gate_up = _local(module.gate_up_proj)  # (E, 2 I_local, H): [gate; up]
            half = gate_up.shape[1] // 2
            self.gate_up_proj = torch.cat([gate_up[:, cols], gate_up[:, half + cols.start:half + cols.stop]], dim=1)
        else:
            self.up_proj = _local(module.up_proj)[:, cols].contiguous()

    def __getattr__(self, name):  # only for what __init__ did not set
        return getattr(self._module, name)


def _local(weight: torch.Tensor) -> torch.Tensor:
    return weight.to_local() if hasattr(weight, "to_local") else weight


def tree_combine(module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                 combine) -> torch.Tensor:
    """combine(view, hidden, index, weights) -> (T, H) for each leaf of this rank, then the pairwise tree."""
    count = _STATE["leaves"]
    width = _local(module.down_proj).shape[-1]
    if width % count:
        raise ValueError(f"an experts down_proj's K ({width}) does not split into {count} equal chunks")
    return pairwise_tree([combine(LeafView(module, i, count), hidden_states, top_k_index, top_k_weights)
                          for i in range(count)])
