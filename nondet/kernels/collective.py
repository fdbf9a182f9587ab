"""The batch-invariant all-reduce: all-gather every rank's partial sum, then add them in rank order.

Under tensor parallelism a row-parallel linear (o_proj, down_proj) computes a partial product on
each rank and an all-reduce sums them: the all-reduce finishes the matmul's K reduction across
ranks. NCCL picks its algorithm (ring, tree, NVLS) and protocol (LL, LL128, Simple) from the
message size, so the summation order of one row can depend on how many rows share the call.
Here the order is fixed: every rank gathers all partials (a copy, no arithmetic) and adds them
as ((p0 + p1) + p2) + ..., in fp32, then casts once to the input dtype. Every rank computes the
same bits, whatever the batch, the backend, or NCCL_ALGO / NCCL_PROTO. On CUDA ranks with symmetric
memory the same sum runs as one one-shot kernel (symmetric_sum.py: the same bits, checked at set-up).

Why fp32: with more than two ranks, bf16 partial sums would round after every add; fp32 keeps
the sum as close to one rounding as a single GPU's fp32-accumulated matmul would be. For two
ranks (p0 + p1 in fp32, one rounding to bf16) it equals a bf16 add.

transformers' tensor-parallel layers (4.5x-5.x) call `torch.distributed.all_reduce` from their
output hooks, so the switch replaces that attribute while the mode is on and restores it when
the mode leaves (mode.py calls `set_enabled`). Nothing happens at import time.
"""

import contextlib

import torch

from nondet.kernels import symmetric_sum
from nondet.kernels.rounded_tree import pairwise_tree
# what the traced step calls, by name: reached as `symmetric_sum.<name>` dynamo met the module both as this
# module's attribute and as its functions' globals, and guarded the pair once per inlined call (DUPLICATE_INPUT:
# 153 of the mode's 2801 guards of a TP2 step at 8 layers of the 8B width, H200 2026-11-30)
from nondet.kernels.symmetric_sum import prepare as prepare_one_shot
from nondet.kernels.symmetric_sum import sum_into as one_shot_sum_into
from nondet.kernels.symmetric_sum import takes as one_shot_takes

NAME = "all_gather + sum in rank order (fp32, cast to the input dtype)"
DEFAULT_NAME = "torch.distributed.all_reduce (backend's own algorithm)"
# the replaced all_reduce while enabled; invariant calls made; tree: combine as rounded_tree.pairwise_tree
_STATE = {"original": None, "calls": 0, "tree": False}


def set_enabled(on: bool) -> None:
    """Route torch.distributed.all_reduce to the invariant one (on) or put the original back (off)."""
    import torch.distributed as dist

    if on and _STATE["original"] is None:
        _STATE["original"] = dist.all_reduce
        dist.all_reduce = invariant_all_reduce
    elif not on and _STATE["original"] is not None:
        dist.all_reduce = _STATE["original"]
        _STATE["original"] = None


@contextlib.contextmanager
def tree_order():
    """Inside: the invariant all-reduce combines the ranks' partials pairwise, each node rounded to
    the dtype (tp_tree.py: the row-parallel linears' K tree continues across the ranks)."""
    from nondet.kernels import custom_ops

    custom_ops.ensure_registered()  # the tree's traced nodes (rounded_tree.pairwise_tree)
    saved = _STATE["tree"]
    try:
        _STATE["tree"] = True
        yield
    finally:
        _STATE["tree"] = saved


def is_enabled() -> bool:
    return _STATE["original"] is not None


def calls() -> int:
    """How many all-reduces took the invariant path in this process (the fingerprint says it ran)."""
    return _STATE["calls"]


def invariant_all_reduce(tensor: torch.Tensor, op=None, group=None, async_op: bool = False):
    """Drop-in for torch.distributed.all_reduce(tensor, op=SUM, group): in place, returns None.

    Other ops, async calls and a world of one go to the original (nothing to make invariant)."""
    import torch.distributed as dist

    # The traced path (a sum, synchronous, several ranks) must not test a collective function for truth:
    # `original or dist.all_reduce` broke torch 2.11's dynamo graph at every call (a data-dependent jump
    # on its rewrite of dist.all_reduce), 2 graphs a layer on the GPU. The original is looked up only
    # where it is called.
    summed = op is None or op == dist.ReduceOp.SUM
    if not summed or async_op or dist.get_world_size(group) == 1:
        return _original()(tensor, op=dist.ReduceOp.SUM if op is None else op, group=group, async_op=async_op)
    if _STATE["tree"] and not tree_is_rank_order(dist.get_world_size(group)):  # --tp-invariant: the K tree's nodes
        tensor.copy_(pairwise_tree(gather(tensor, group)))
        return _counted()
    if not torch.compiler.is_compiling():  # once per process, at an eager call every rank is in
        prepare_one_shot(tensor, group, _original())
    if one_shot_takes(tensor, group):
        one_shot_sum_into(tensor)  # the gathered sum's bits in one kernel (checked at set-up)
    else:
        tensor.copy_(gathered_sum(tensor, group))
    return _counted()


def tree_is_rank_order(world: int) -> bool:
    """Whether the tree's nodes across `world` ranks are the rank-order sum's bits: at two ranks the tree
    has one node, (p0 + p1) in fp32 rounded once (custom_ops.rounded_add), the gathered sum's arithmetic, so
    the tree may take the one-shot (2 x H200: 72 all-reduces a step, the gather 15.6-23.3 us each against
    the one-shot's 7.3-11.8). At four or more the nodes round between adds, which the one-shot's check rejects."""
    return world == 2


def _counted() -> None:
    """Count an invariant all-reduce made eagerly; returns None, as torch.distributed.all_reduce does."""
    if not torch.compiler.is_compiling():  # traced, the count would be a guard: a recompile per call
        _STATE["calls"] += 1  # (transformers' compiled generate prefills eagerly: its calls are counted)


def route() -> str:
    """How this process's invariant all-reduces summed (the run's fingerprint says which path ran)."""
    return symmetric_sum.route() or NAME


def _original():
    import torch.distributed as dist

    return dist.all_reduce if _STATE["original"] is None else _STATE["original"]


def gather(tensor: torch.Tensor, group=None) -> list[torch.Tensor]:
    """Every rank's tensor, indexed by rank in the group (all_gather copies; it adds nothing)."""
    import torch.distributed as dist

    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return parts


def gathered_sum(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """The gather route's sum of every rank's `tensor`, in its dtype: the bits the one-shot must give."""
    return rank_order_sum(gather(tensor, group)).to(tensor.dtype)


def rank_order_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """((p0 + p1) + p2) + ... in fp32: the one fixed order."""
    total = parts[0].float()
    for part in parts[1:]:
        total = total + part.float()
    return total
