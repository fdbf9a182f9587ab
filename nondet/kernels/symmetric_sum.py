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
every rank got the gathered sum's bits (any other order of three or more values, or a rounding between
adds, gives other bits there: tests/test_symmetric_sum.py). Where the check fails or symmetric memory is
missing (CPU, gloo, no P2P), the all-gather path runs, with the same bits, so which path ran never
changes a token; `route()` names it for the run's fingerprint.

fp32 partials double the bytes a rank reads: at W = 2, B = 64 the fp32 one-shot took 20.6 us against
12.1 us in bf16 (2 x H200, 2026-11-29). So bf16 partials go in as they are where bf16's own one-shot
passes the same check (bf16 partials, the expected sum rank_order_sum's cast once; a buffer of its own).
At W = 2 it must pass: one add of two bf16 values rounded once equals their fp32 sum rounded once (fp32
has more than 2p + 2 bits, so the double rounding is innocuous); above 2 it passes only if the kernel
accumulates in fp32 in rank order. (torch's one-shot dispatches fp32 and bf16 only, by its source: fp16
goes in as fp32.)

The buffer is set up at the first eager all-reduce of a world (every rank of the group is in that call,
so its collectives line up); a traced call before that takes the gather path. It lives as long as the
process: a compiled step's CUDA graphs keep its address. NONDET_SYMMETRIC_SUM=0 keeps the gather path.
"""

import logging
import os

import torch

ENV = "NONDET_SYMMETRIC_SUM"  # "0": never take the one-shot (the gather path's timings, a control)
BUFFER_ELEMENTS = 16 * 1024 * 1024  # 64 MiB in fp32 (bf16's 32 MiB): a 64 x 32-token prefill of hidden 4096 fits twice
CHECK_ELEMENTS = 4096
MULTICAST_ENV = "TORCH_SYMM_MEM_DISABLE_MULTICAST"  # read when the buffer is made: "1", NVLink P2P loads only
ONE_SHOT_OP = "one_shot_all_reduce_copy"  # torch.ops.symm_mem's op; the graph census sorts it by this name
NAME = "one-shot sum over symmetric memory (fp32 in rank order, cast once to the input dtype)"
# world: the world size the set-up was tried for (0: not yet); buffer: the symmetric fp32 buffer (None:
# the gather path); bf16_buffer: bf16's own (None: bf16 goes in as fp32); group: the world group's name;
# refused: why this process keeps the gather path (None: not refused, or not tried)
_STATE = {"world": 0, "buffer": None, "bf16_buffer": None, "group": "", "refused": None}


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

    if _STATE["world"] or not tensor.is_cuda:  # (collective.py calls it only outside a trace)
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
    """tensor <- the sum of every rank's tensor (in place): bf16 as it is where its one-shot passed the
    check, else fp32 partials, the one-shot, one cast."""
    if tensor.dtype == torch.bfloat16 and _STATE["bf16_buffer"] is not None:
        total = _one_shot(_STATE["bf16_buffer"], tensor.contiguous(), _STATE["group"])
    else:
        total = _one_shot(_STATE["buffer"], tensor.float().contiguous(), _STATE["group"])
    tensor.copy_(total)


def _one_shot(buffer: torch.Tensor, partial: torch.Tensor, group: str) -> torch.Tensor:
    """The one-shot sum of every rank's `partial` through the symmetric `buffer` (of its dtype)."""
    slot = buffer.narrow(0, 0, partial.numel()).view(partial.shape)
    return torch.ops.symm_mem.one_shot_all_reduce_copy(slot, partial, "sum", group)  # ONE_SHOT_OP


def native_dtypes() -> tuple:
    """The dtypes summed as they are, beside fp32 (their own one-shot passed the check)."""
    return (torch.bfloat16,) if _STATE["bf16_buffer"] is not None else ()


def _set_up(device: torch.device, original_all_reduce) -> str | None:
    """The fp32 buffer, then bf16's, each made, rendezvoused and checked on every rank; the group takes
    one only if every rank's check passed (a vote). None when the fp32 one holds, else why not."""
    import torch.distributed as dist

    saved = os.environ.get(MULTICAST_ENV)
    os.environ[MULTICAST_ENV] = "1" if saved is None else saved  # P2P loads only, unless the user chose
    try:
        group = dist.group.WORLD.group_name
        # a rendezvous waits for every rank: agree first that every rank can take part in one
        if not _every_rank(_can_take_part(device), device, original_all_reduce):
            return "symmetric memory unavailable on some rank (torch's module, or peer access to every GPU)"
        fp32, why = _checked_buffer(torch.float32, group, device)
        if not _every_rank(fp32 is not None, device, original_all_reduce):
            return why or "another rank's check failed"
        bf16, _ = _checked_buffer(torch.bfloat16, group, device)
        native = _every_rank(bf16 is not None, device, original_all_reduce)
    finally:
        if saved is None:
            os.environ.pop(MULTICAST_ENV, None)
    _STATE.update(buffer=fp32, bf16_buffer=bf16 if native else None, group=group)
    _quiet_inductor_about_the_buffer()
    return None


def _can_take_part(device) -> bool:
    """Whether this rank can join a rendezvous: torch's symmetric memory imports, and this GPU reads
    every other visible GPU over P2P (the one-shot's loads; a group over several hosts has fewer
    visible GPUs than ranks)."""
    import torch.distributed as dist

    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError:
        return False
    here, count = torch.device(device).index or 0, torch.cuda.device_count()
    return dist.get_world_size() <= count and all(
        torch.cuda.can_device_access_peer(here, other) for other in range(count) if other != here)


def _checked_buffer(dtype: torch.dtype, group: str, device) -> tuple:
    """(a symmetric buffer of `dtype` whose one-shot gave the gathered sum's bits, None) or (None, why)."""
    import torch.distributed as dist

    try:
        import torch.distributed._symmetric_memory as symm_mem

        buffer = symm_mem.empty((BUFFER_ELEMENTS,), dtype=dtype, device=device)
        symm_mem.rendezvous(buffer, group)
        # a compiled step's CUDA graphs must read this buffer itself, not a copy of it (a copy is not
        # symmetric): its address is static, as a parameter's
        torch._dynamo.mark_static_address(buffer)
        world = dist.get_world_size()
        total = _one_shot(buffer, check_partials(dist.get_rank(), world, device, dtype), group)
        if agrees_with_rank_order(total, world, device, dtype):
            return buffer, None
        return None, f"the {dtype} one-shot's sum differed from the gathered sum in rank order"
    except Exception as exc:  # noqa: BLE001 (no symmetric memory here: the gather path, same bits)
        return None, f"symmetric memory unavailable ({type(exc).__name__}: {str(exc)[:120]})"


def _every_rank(passed: bool, device, original_all_reduce) -> bool:
    """Whether every rank passed (a MIN over the group by the backend's own all-reduce)."""
    import torch.distributed as dist

    vote = torch.tensor([int(passed)], device=device)
    original_all_reduce(vote, op=dist.ReduceOp.MIN)
    return vote.item() == 1


class _OurBufferIsSymmetric(logging.Filter):
    """torch 2.11's Inductor warns at every one-shot it lowers that it could not make the buffer argument
    symmetric memory ("Failed to realize the input as a symmetric memory buffer"): it is a graph input it
    did not allocate, our buffer, which is symmetric (rendezvoused above). 292 lines a 36-layer TP2
    compile; this drops that one message once the buffer exists."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to realize the input as a symmetric memory buffer")


def _quiet_inductor_about_the_buffer() -> None:
    logger = logging.getLogger("torch._inductor.comm_lowering")
    if not any(isinstance(f, _OurBufferIsSymmetric) for f in logger.filters):
        logger.addFilter(_OurBufferIsSymmetric())


def check_partials(rank: int, world: int, device, dtype=torch.float32) -> torch.Tensor:
    """Rank `rank`'s partial of the set-up check, in `dtype`: sums of these in another order than
    ((p0 + p1) + p2) + ..., or with a rounding between adds, come out with other bits.

    Two parts. Values spread over 2^-20..2^20 (2^-14..2^12 in fp16, its range): a rounding between adds
    shows on some of 4096. And, for every ordered triple of ranks (a, b, c), one element where a holds
    +2^12, b -2^12, c 2^-14 and the others 0: the sum is 2^-14 if c's value is added after both big ones
    and 0 otherwise (2^-14 is below half of fp32's step at 2^12, so it is lost when added to one), so
    an order that puts another rank last among three gives a 0 where rank order gives 2^-14 (the order
    of the first two adds alone never changes a sum, and is not asked)."""
    import itertools

    gen = torch.Generator().manual_seed(7919 * (rank + 1) + world)
    low, high = (-14, 12) if dtype == torch.float16 else (-20, 20)
    scale = torch.exp2(torch.randint(low, high + 1, (CHECK_ELEMENTS,), generator=gen).float())
    spread = torch.randn(CHECK_ELEMENTS, generator=gen) * scale
    by_role = {0: 2.0 ** 12, 1: -(2.0 ** 12), 2: 2.0 ** -14}
    triples = [by_role[t.index(rank)] if rank in t else 0.0 for t in itertools.permutations(range(world), 3)]
    triples += [0.0] * (-len(triples) % 16)  # a whole number of 16-element (64-byte) pieces, as activations are
    return torch.cat([spread, torch.tensor(triples)]).to(dtype).to(device)


def agrees_with_rank_order(total: torch.Tensor, world: int, device, dtype=torch.float32) -> bool:
    """Whether `total` is bitwise rank_order_sum of every rank's check partial in `dtype` (fp32 adds in
    rank order), cast once to `dtype`."""
    expected = check_partials(0, world, device, dtype).float()
    for rank in range(1, world):
        expected = expected + check_partials(rank, world, device, dtype).float()
    expected = expected.to(dtype)
    return total.dtype == dtype and torch.equal(total.view(torch.uint8), expected.view(torch.uint8))
