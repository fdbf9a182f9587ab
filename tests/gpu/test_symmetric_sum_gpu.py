"""The mode's all-reduce as a one-shot over symmetric memory (kernels/symmetric_sum.py), on 2 GPUs:
it is set up (its check passed, bf16 summed as it is), it gives the gathered sum's bits eager (bf16 and
fp32) and compiled under CUDA graphs, and row 0's sum is the same at every batch size. The control: the
same kernel fed fp32 partials rounded to bf16 first (a rounding the gathered sum does not make) is
refused by the set-up check on this host."""

import hashlib
import os
import socket
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

HIDDEN = 4096
BATCHES = (1, 8, 64)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(rank: int, batch: int, dtype=torch.bfloat16):
    first = torch.randn(1, HIDDEN, device="cuda", generator=torch.Generator("cuda").manual_seed(7 + rank))
    rest = torch.randn(batch - 1, HIDDEN, device="cuda", generator=torch.Generator("cuda").manual_seed(100 * batch + rank))
    return torch.cat([first, rest]).to(dtype)


def _digest(t) -> str:
    """Bits of a tensor as text (a tensor sent through a queue needs its sender alive to be read)."""
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


def _rank(rank: int, world: int, port: int, queue) -> None:
    import torch.distributed as dist

    from nondet.kernels import collective, symmetric_sum

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    # a rank that fails leaves the other in a collective: NCCL's watchdog ends it after a minute
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank),
                            timeout=timedelta(seconds=60))
    found = {"rank": rank, "equal": [], "row0": [], "compiled_equal": []}
    collective.set_enabled(True)
    try:
        for dtype in (torch.bfloat16, torch.float32):  # bf16 as it is (native), fp32 partials
            for batch in BATCHES:
                x = _rows(rank, batch, dtype)
                summed = x.clone()
                dist.all_reduce(summed)  # the mode's: the first eager call sets the one-shot up
                found["equal"].append(bool(torch.equal(summed, collective.gathered_sum(x))))
                found["row0"].append(_digest(summed[0]))
        found["route"], found["refused"] = symmetric_sum.route(), symmetric_sum.refused()
        found["native"] = [str(d) for d in symmetric_sum.native_dtypes()]

        def step(t):
            out = t * 1.0  # a new tensor, as a linear's output is
            dist.all_reduce(out)
            return out

        compiled = torch.compile(step, mode="reduce-overhead", dynamic=False)
        for batch in BATCHES:
            x = _rows(rank, batch)
            for _ in range(3):  # warm-up, record, replay
                out = compiled(x).clone()
            found["compiled_equal"].append(bool(torch.equal(out, collective.gathered_sum(x))))
        # the control: the one-shot kernel on the check's partials rounded to bf16 first
        here = symmetric_sum.check_partials(rank, world, "cuda").bfloat16().float()
        rounded = symmetric_sum._one_shot(symmetric_sum._STATE["buffer"], here, symmetric_sum._STATE["group"])
        found["control_agrees"] = symmetric_sum.agrees_with_rank_order(rounded, world, "cuda")
    except Exception as exc:  # the parent reads it (a traceback in a child is not the test's failure line)
        found["error"] = f"{type(exc).__name__}: {exc}"
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
    ranks = sorted((queue.get(timeout=60) for _ in range(2)), key=lambda f: f["rank"])
    for found in ranks:
        assert "error" not in found, found["error"]
        assert found["route"] == symmetric_sum.NAME and found["refused"] is None, found["refused"]
        assert "torch.bfloat16" in found["native"]  # W = 2: one add rounded once, as the fp32 sum cast
        assert found["equal"] == [True] * 2 * len(BATCHES)  # eager: the all-gather route's bits
        assert found["compiled_equal"] == [True] * len(BATCHES)  # compiled, CUDA graphs replayed
        bf16_row0, fp32_row0 = found["row0"][:len(BATCHES)], found["row0"][len(BATCHES):]
        assert len(set(bf16_row0)) == 1 and len(set(fp32_row0)) == 1  # row 0 at every batch size
        assert found["control_agrees"] is False, "control: partials rounded to bf16 passed the set-up check"
    assert ranks[0]["row0"] == ranks[1]["row0"]  # the same bits on both ranks
