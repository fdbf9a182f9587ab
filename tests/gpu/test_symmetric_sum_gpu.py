"""The mode's all-reduce as a one-shot over symmetric memory (kernels/symmetric_sum.py), on 2 GPUs:
it is set up (its check passed), it gives the gathered sum's bits eager and compiled under CUDA graphs,
and row 0's sum is the same at every batch size. The control: the same kernel fed bf16 partials (a
rounding the gathered fp32 sum does not make) is refused by the set-up check on this host."""

import os
import socket

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

HIDDEN = 4096
BATCHES = (1, 8, 64)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gathered(tensor):
    """The all-gather route's sum (collective.py without the one-shot)."""
    from nondet.kernels import collective

    return collective.rank_order_sum(collective.gather(tensor)).to(tensor.dtype)


def _rows(rank: int, batch: int):
    first = torch.randn(1, HIDDEN, device="cuda", generator=torch.Generator("cuda").manual_seed(7 + rank))
    rest = torch.randn(batch - 1, HIDDEN, device="cuda", generator=torch.Generator("cuda").manual_seed(100 * batch + rank))
    return torch.cat([first, rest]).bfloat16()


def _rank(rank: int, world: int, port: int, queue) -> None:
    import torch.distributed as dist

    from nondet.kernels import collective, symmetric_sum

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    found = {"rank": rank, "equal": [], "row0": [], "compiled_equal": []}
    collective.set_enabled(True)
    try:
        for batch in BATCHES:
            x = _rows(rank, batch)
            summed = x.clone()
            dist.all_reduce(summed)  # the mode's: the first eager call sets the one-shot up
            found["equal"].append(bool(torch.equal(summed, _gathered(x))))
            found["row0"].append(summed[0].float().cpu())
        found["route"], found["refused"] = symmetric_sum.route(), symmetric_sum.refused()

        def step(t):
            out = t * 1.0  # a new tensor, as a linear's output is
            dist.all_reduce(out)
            return out

        compiled = torch.compile(step, mode="reduce-overhead", dynamic=False)
        for batch in BATCHES:
            x = _rows(rank, batch)
            for _ in range(3):  # warm-up, record, replay
                out = compiled(x).clone()
            found["compiled_equal"].append(bool(torch.equal(out, _gathered(x))))
        # the control: the one-shot kernel on the check's partials rounded to bf16 first
        group = dist.group.WORLD.group_name
        here = symmetric_sum.check_partials(rank, world, "cuda").bfloat16()
        slot = symmetric_sum._STATE["buffer"].narrow(0, 0, here.numel())
        rounded = torch.ops.symm_mem.one_shot_all_reduce_copy(slot, here.float(), "sum", group)
        found["control_agrees"] = symmetric_sum.agrees_with_rank_order(rounded, world, "cuda")
    finally:
        collective.set_enabled(False)
    queue.put(found)
    dist.barrier()
    dist.destroy_process_group()


def test_the_one_shot_is_set_up_and_gives_the_gathered_sums_bits_and_its_control_fires():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    import torch.multiprocessing as mp

    from nondet.kernels import symmetric_sum

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.spawn(_rank, args=(2, _free_port(), queue), nprocs=2, join=True)
    ranks = sorted((queue.get() for _ in range(2)), key=lambda f: f["rank"])
    for found in ranks:
        assert found["route"] == symmetric_sum.NAME and found["refused"] is None, found["refused"]
        assert found["equal"] == [True] * len(BATCHES)  # eager: the all-gather route's bits
        assert found["compiled_equal"] == [True] * len(BATCHES)  # compiled, CUDA graphs replayed
        assert all(torch.equal(found["row0"][0], row) for row in found["row0"])  # row 0 at every batch size
        assert found["control_agrees"] is False, "control: bf16 partials passed the set-up check"
    assert torch.equal(ranks[0]["row0"][0], ranks[1]["row0"][0])  # the same bits on both ranks
