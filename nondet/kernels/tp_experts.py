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

Cost: a rank holding more than one leaf (TP1 under a tree of 2) copies its leaves' slices of the experts'
weights once and holds them while the weights live (held_leaves, as tp_tree's linears hold their K
chunks): the experts' weights twice in memory. A rank holding one leaf reads the module's own weights.

Layouts covered: concatenated [gate; up] (or up_proj alone), not transposed, no bias, no norm after
the expert; tp_tree.uncovered_reason names what else a plan shards row-wise in an experts module, so
--tp-invariant refuses it in one line instead of running it outside the tree.
"""

import torch
from torch.utils.weak import WeakIdKeyDictionary

from nondet.kernels import held_weights
from nondet.kernels.rounded_tree import pairwise_tree

# an experts module's down_proj -> ((leaves, the other projections' versions), down_proj's version), its
# leaves' weights): held while the weights live (held_leaves)
_HELD = WeakIdKeyDictionary()
_STATE = {"leaves": 0, "held": None}  # the experts call in progress: its leaves (0: no tree) and
# (module, its held leaves' weights) where tp_tree.tree_linears made them


def set_leaves(leaves: int, held: tuple | None = None) -> None:
    _STATE["leaves"], _STATE["held"] = leaves, held


def leaves() -> int:
    return _STATE["leaves"]


class LeafView:
    """The experts module restricted to chunk `index` of `count` along its intermediate dim: every
    attribute is the module's, except the projection weights (`weights`, else leaf_weights made here)."""

    def __init__(self, module, index: int, count: int, weights: dict | None = None):
        self._module = module
        for name, tensor in (weights if weights is not None else leaf_weights(module, index, count)).items():
            setattr(self, name, tensor)

    def __getattr__(self, name):  # only for what __init__ did not set
        return getattr(self._module, name)


def leaf_weights(module, index: int, count: int) -> dict[str, torch.Tensor]:
    """Chunk `index` of `count` of the experts' projection weights along the intermediate dim: copies,
    contiguous (the module's own local weights where count is 1)."""
    down = held_weights.local(module.down_proj)  # (E, H, I_local)
    width = down.shape[-1] // count
    if down.shape[-1] % count:
        raise ValueError(f"an experts down_proj's K ({down.shape[-1]}) does not split into {count} equal chunks")
    gated = getattr(module, "has_gate", True)
    if count == 1:
        name = "gate_up_proj" if gated else "up_proj"
        return {"down_proj": down, name: held_weights.local(getattr(module, name))}
    cols = slice(index * width, (index + 1) * width)
    weights = {"down_proj": down[:, :, cols].contiguous()}
    if gated:
        gate_up = held_weights.local(module.gate_up_proj)  # (E, 2 I_local, H): [gate; up]
        half = gate_up.shape[1] // 2
        weights["gate_up_proj"] = torch.cat([gate_up[:, cols], gate_up[:, half + cols.start:half + cols.stop]], dim=1)
    else:
        weights["up_proj"] = held_weights.local(module.up_proj)[:, cols].contiguous()
    return weights


def held_leaves(module, count: int) -> list[dict[str, torch.Tensor]]:
    """leaf_weights of each of `count` leaves, made once while the module's weights live and keep their
    values, as static Parameters (a traced step reads them as it reads the model's parameters)."""
    others = tuple(held_weights.version(getattr(module, name)) for name in ("gate_up_proj", "up_proj")
                   if isinstance(getattr(module, name, None), torch.Tensor))

    def make():
        return [{name: held_weights.static(tensor) for name, tensor in leaf_weights(module, i, count).items()}
                for i in range(count)]
    return held_weights.held(_HELD, module.down_proj, (count, others), make)


def tree_combine(module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                 combine) -> torch.Tensor:
    """combine(view, hidden, index, weights) -> (T, H) for each leaf of this rank, then the pairwise tree."""
    count, held = _STATE["leaves"], _STATE["held"]  # an unequal split is refused by leaf_weights
    made = held[1] if held is not None and held[0] is module and len(held[1]) == count else [None] * count
    return pairwise_tree([combine(LeafView(module, i, count, made[i]), hidden_states, top_k_index, top_k_weights)
                          for i in range(count)])
