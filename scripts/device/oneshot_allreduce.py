"""Experiment (not the product's path): the mode's all-reduce as torch's one-shot all-reduce over symmetric
memory, for gpu_tp_speed.py's "+oneshot" rows.

Why: at W = 4 the mode's all-reduce (all_gather, then an fp32 sum in rank order) took 28.4 / 41.9 us at
B = 1 / 64 against NCCL's 17.2 / 21.8 and the one-shot's 8.1 / 14.3 (4 x H200, 2026-11-28), and the mode's
TP4 step was slower than its TP1 step. In the one-shot each rank reads every peer's buffer over NVLink
and adds the W values of an element in one order, so an element's sum does not depend on how many rows
share the call: batch-invariant by construction, which gpu_allreduce_latency.py checks on the device (row
0 across batch sizes, and the same bits on every rank) before a row here means anything. At W = 2 its one
bf16 add equals the mode's fp32 sum cast once, so a TP2 "+oneshot" row must give the mode's logits hash;
at W > 2 its bf16 adds round after each, so its bits are its own.

Inside `one_shot_all_reduce()` (entered after the mode, which replaced torch.distributed.all_reduce with
its own), a synchronous sum over the whole world whose tensor fits the symmetric buffer goes through
`torch.ops.symm_mem.one_shot_all_reduce_copy`; anything else to the function it replaced.
"""

import contextlib
import os

import torch
import torch.distributed as dist

BUFFER_ELEMENTS = 32 * 1024 * 1024  # bf16: 64 MiB, more than a 64 x 32-token prefill of hidden 4096


@contextlib.contextmanager
def one_shot_all_reduce(dtype=torch.bfloat16):
    """Every rank must enter it together (the buffer's rendezvous is a collective)."""
    import torch.distributed._symmetric_memory as symm_mem

    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")  # P2P loads only, as NVLS is off
    world_group = dist.group.WORLD.group_name
    buffer = symm_mem.empty((BUFFER_ELEMENTS,), dtype=dtype, device="cuda")
    symm_mem.rendezvous(buffer, world_group)
    replaced = dist.all_reduce
    world = dist.get_world_size()

    def all_reduce(tensor, op=None, group=None, async_op=False):
        summed = op is None or op == dist.ReduceOp.SUM
        whole_world = group is None or dist.get_world_size(group) == world
        if not summed or async_op or not whole_world or tensor.dtype != dtype or tensor.numel() > BUFFER_ELEMENTS:
            return replaced(tensor, op=dist.ReduceOp.SUM if op is None else op, group=group, async_op=async_op)
        # the buffer's first numel elements, shaped as the input (the kernel copies the input in, then reads
        # every peer's copy); Inductor lowers the op to a fallback kernel over the realized buffer
        slot = buffer.narrow(0, 0, tensor.numel()).view(tensor.shape)
        tensor.copy_(torch.ops.symm_mem.one_shot_all_reduce_copy(slot, tensor.contiguous(), "sum", world_group))
        return None

    dist.all_reduce = all_reduce
    try:
        yield
    finally:
        dist.all_reduce = replaced
