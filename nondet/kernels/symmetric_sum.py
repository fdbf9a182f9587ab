"""The mode's all-reduce in one kernel: a one-shot sum over symmetric memory, fp32, ranks in order.

The invariant all-reduce (collective.py) all-gathers every rank's partial and adds them in rank order in
fp32: two collectives' worth of latency and a sum kernel, 16.5 us against NCCL's 12.1 at W = 2, B = 1
(4 x H200, 2026-11-28), 72 times a 36-layer decode step. torch's one-shot all-reduce over symmetric
memory (`torch.ops.symm_mem.one_shot_all_reduce_copy`) has every rank read its peers' buffers over
NVLink and add the W values of an element itself: 6.5 us at W = 2 (2 x H200, 2026-11-29). Each element's
sum is made of the same W values whatever the batch, so it is batch-invariant by construction.

Its bits are the gathered sum's, not merely invariant: the partials go in as fp32 (a cast, exact), the
kernel adds fp32 values, and the sum is cast once to the input dtype, as rank_order_sum does. That holds
only if the kernel adds in rank order 0..W-1, which its source reads as but no document promises. So a
group takes this path only after a check that would fail otherwise (`agrees_with_rank_order`): every
rank sums known partials of a wide exponent range both ways and the group takes the one-shot only if
every rank got the gathered sum's bits (any other order of three or more values, or a bf16 add, gives
other bits there: tests/test_symmetric_sum.py). Where the check fails or symmetric memory is missing
(CPU, gloo, no P2P), the all-gather path runs, with the same bits, so which path ran never changes a
token; `route()` names it for the run's fingerprint.

The buffer is set up at the first eager all-reduce of a world (every rank of the group is in that call,
so its collectives line up); a traced call before that takes the gather path. It lives as long as the
process: a compiled step's CUDA graphs keep its address. NONDET_SYMMETRIC_SUM=0 keeps the gather path.
"""

import os

import torch

ENV = "NONDET_SYMMETRIC_SUM"  # "0": never take the one-shot (the gather path's timings, a control)
BUFFER_ELEMENTS = 16 * 1024 * 1024  # fp32, 64 MiB: a 64 x 32-token prefill of hidden 4096 fits twice
CHECK_ELEMENTS = 4096
MULTICAST_ENV = "TORCH_SYMM_MEM_DISABLE_MULTICAST"  # read when the buffer is made: "1", NVLink P2P loads only
NAME = "one-shot sum over symmetric memory (fp32, ranks in order, cast to the input dtype)"
# world: the world size the buffer was set up for (0: not yet); buffer: the symmetric fp32 buffer;
# group: the world group's name; refused: why this process keeps the gather path (None: not refused)
_STATE = {"world": 0, "buffer": None, "group": "", "refused": None}


def route() -> str | None:
    """The one-shot's name when this process set it up, else None (the gather path ran)."""
    return NAME if _STATE["buffer"] is not None else None


def refused() -> str | None:
    """Why the one-shot is not used here, once a setup was tried (None: used, or never tried)."""
    return _STATE["refused"]


def takes(tensor: torch.Tensor, group) -> bool:
    """Whether this all-reduce goes through the one-shot: set up, on the world's ranks, and it fits."""
    import torch.distributed as dist

    return (_STATE["buffer"] is not None and tensor.is_cuda and tensor.numel() <= BUFFER_ELEMENTS
            and dist.get_world_size(group) == _STATE["world"])


def prepare(tensor: torch.Tensor, group, original_all_reduce) -> None:
    """At an eager all-reduce, once per process: set up and check the one-shot for the world's group.

    Every rank of the group is in this call (it is inside their all-reduce), so the rendezvous and the
    check's collectives line up. A failure of either leaves the gather path, with the reason kept."""
    import torch.distributed as dist

    if _STATE["world"] or torch.compiler.is_compiling() or not tensor.is_cuda:
        return
    world = dist.get_world_size()
    _STATE["world"] = world  # tried once, whatever comes of it
    if os.environ.get(ENV) == "0":
        _STATE["refused"] = f"{ENV}=0"
    elif dist.get_world_size(group) != world:
        _STATE["refused"] = "the all-reduce's group is not the whole world"
    else:
        _STATE["refused"] = _set_up(tensor.device, original_all_reduce)


def sum_into(tensor: torch.Tensor) -> None:
    """tensor <- the sum of every rank's tensor: fp32 partials, one-shot, one cast (in place)."""
    slot = _STATE["buffer"].narrow(0, 0, tensor.numel()).view(tensor.shape)
    total = torch.ops.symm_mem.one_shot_all_reduce_copy(slot, tensor.float().contiguous(), "sum", _STATE["group"])
    tensor.copy_(total)


def _set_up(device: torch.device, original_all_reduce) -> str | None:
    """Allocate and rendezvous the buffer, then check the sum's bits on every rank. None when it holds."""
    import torch.distributed as dist

    saved = os.environ.get(MULTICAST_ENV)
    try:
        import torch.distributed._symmetric_memory as symm_mem

        os.environ[MULTICAST_ENV] = "1" if saved is None else saved  # P2P loads only, unless the user chose
        group = dist.group.WORLD.group_name
        buffer = symm_mem.empty((BUFFER_ELEMENTS,), dtype=torch.float32, device=device)
        symm_mem.rendezvous(buffer, group)
        # a compiled step's CUDA graphs must read this buffer itself, not a copy of it (a copy is not
        # symmetric): its address is static, as a parameter's
        torch._dynamo.mark_static_address(buffer)
        here = check_partials(dist.get_rank(), dist.get_world_size(), device)
        slot = buffer.narrow(0, 0, here.numel())
        total = torch.ops.symm_mem.one_shot_all_reduce_copy(slot, here, "sum", group)
        agreed = agrees_with_rank_order(total, dist.get_world_size(), device)
    except Exception as exc:  # noqa: BLE001 (no symmetric memory here: the gather path, same bits)
        agreed, why = False, f"symmetric memory unavailable ({type(exc).__name__}: {str(exc)[:120]})"
    else:
        why = "the one-shot's sum differed from the gathered sum in rank order on some rank"
    finally:
        if saved is None:
            os.environ.pop(MULTICAST_ENV, None)
    votes = torch.tensor([int(agreed)], device=device)
    original_all_reduce(votes, op=dist.ReduceOp.MIN)  # every rank takes the same path, or none does
    if votes.item() != 1:
        return why if not agreed else "another rank's check failed"
    _STATE.update(buffer=buffer, group=group)
    return None


def check_partials(rank: int, world: int, device) -> torch.Tensor:
    """Rank `rank`'s partial of the check: fp32 values spread over 2^-20..2^20, so that sums of the same
    values in another order, or with a bf16 rounding between adds, come out with other bits."""
    gen = torch.Generator().manual_seed(7919 * (rank + 1) + world)
    values = torch.randn(CHECK_ELEMENTS, generator=gen) * torch.exp2(torch.randint(-20, 21, (CHECK_ELEMENTS,), generator=gen))
    return values.to(device)


def agrees_with_rank_order(total: torch.Tensor, world: int, device) -> bool:
    """Whether `total` is bitwise ((p0 + p1) + p2) + ... in fp32 of every rank's check partial."""
    expected = check_partials(0, world, device)
    for rank in range(1, world):
        expected = expected + check_partials(rank, world, device)
    return torch.equal(total.view(torch.int32), expected.view(torch.int32))
