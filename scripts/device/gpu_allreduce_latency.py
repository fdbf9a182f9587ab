"""One all-reduce of a decode step's activations, per call: NCCL, the mode's invariant one, a one-shot P2P one.

    python3 scripts/device/gpu_allreduce_latency.py [--worlds 2,4] [--batches 1,8,64] [--out DIR]

Why: a compiled TP2 decode step of the 8B shape (36 layers, 72 all-reduces of B x 4096 bf16) took
12.2 ms at B = 1 against one GPU's 8.5 ms (4 x H200, 2026-11-28): about 0.1 ms a layer more than half
the weights' read would allow, i.e. the all-reduces. This times one all-reduce of (B, 4096) bf16 as the
step issues them, 72 in a row captured in one CUDA graph (the compiled step replays graphs), for:

    nccl        torch.distributed.all_reduce (NCCL picks ring / tree and the protocol; NVLS off)
    invariant   kernels.collective.invariant_all_reduce, the mode's: since 2026-11-29 the one-shot below
                (bf16 as it is, or fp32 partials) where symmetric memory passed its set-up check
                (kernels/symmetric_sum.py; the route line says which ran), else the gather route
    gather      the gather route: all_gather, then an fp32 sum in rank order (the mode's before)
    one-shot    torch.ops.symm_mem.one_shot_all_reduce_copy: every rank reads every peer's buffer over
                NVLink (P2P loads, no multicast) and adds the W values in rank order 0..W-1, the same
                order on every rank and for every row
    two-shot    copy into the symmetric buffer, then torch.ops.symm_mem.two_shot_all_reduce_: each rank sums
                a 1/W slice of the rows' elements and writes it to every peer (a reduce-scatter then an
                all-gather, both over NVLink): half the one-shot's reads at W = 2, two barriers; its bits are
                checked against the one-shot's (the mode could take it only where they agree)

and checks the one-shot's bits: equal on every rank, row 0 (the same values at every batch size) the same
at every batch size, and against the invariant all-reduce's (W = 2: one bf16 add is one rounding of the
fp32 sum, so they must agree; W > 2: its bf16 adds round after each).
Prints a Markdown table, writes $OUT/allreduce_latency.json.
"""

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_attention_stages import graph_us  # noqa: E402
from nondet.probes.tp.group import free_port  # noqa: E402

HIDDEN = 4096
CALLS = 72  # all-reduces in one 36-layer decode step (o_proj and down_proj of each layer)


def _us(fn) -> float:
    """us per call, CALLS calls in one CUDA graph, median of 20 replays started together on every rank."""
    return graph_us(fn, calls=CALLS, replays=20, before_replay=_aligned)


def _aligned() -> None:
    """The ranks start a replay together: a replay's time is then the collectives', not a peer's lag."""
    dist.barrier()
    torch.cuda.synchronize()


def _rank(rank: int, world: int, port: int, batches: list[int], queue) -> None:
    import torch.distributed._symmetric_memory as symm_mem

    from nondet.kernels import collective

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    group = dist.group.WORLD.group_name
    rows = []
    for batch in batches:
        gen = torch.Generator("cuda").manual_seed(1000 * batch + rank)
        # row 0 the same values at every batch size (its own seed per rank): its sum must not change with B
        first = torch.randn(1, HIDDEN, device="cuda", generator=torch.Generator("cuda").manual_seed(7 + rank))
        x = torch.cat([first, torch.randn(batch - 1, HIDDEN, device="cuda", generator=gen)]).bfloat16()
        work = x.clone()
        buffer = symm_mem.empty((batch, HIDDEN), dtype=torch.bfloat16, device="cuda")
        symm_mem.rendezvous(buffer, group)
        one_shot = torch.ops.symm_mem.one_shot_all_reduce_copy(buffer, x, "sum", group)
        reference = x.clone()
        collective.invariant_all_reduce(reference)
        hashes = [None] * world
        dist.all_gather_object(hashes, hashlib.sha256(one_shot.cpu().view(torch.int16).numpy().tobytes()).hexdigest())
        row = {"world": world, "batch": batch, "one_shot_same_on_every_rank": len(set(hashes)) == 1,
               "one_shot_row0": hashlib.sha256(one_shot[0].cpu().view(torch.int16).numpy().tobytes()).hexdigest()[:12],
               "one_shot_equals_invariant": bool(torch.equal(one_shot, reference)),
               "nccl_us": _us(lambda: dist.all_reduce(work)),
               "invariant_us": _us(lambda: collective.invariant_all_reduce(work)),
               "route": collective.route(),
               "gather_us": _us(lambda: work.copy_(collective.gathered_sum(work))),
               "one_shot_us": _us(lambda: torch.ops.symm_mem.one_shot_all_reduce_copy(buffer, x, "sum", group))}
        row.update(_two_shot(buffer, x, one_shot, group, world))
        rows.append(row)
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def _two_shot(buffer, x, one_shot, group: str, world: int) -> dict:
    """The two-shot's time and bits (against the one-shot's, and across ranks), or the reason it did not run."""
    def call():
        buffer.copy_(x)
        torch.ops.symm_mem.two_shot_all_reduce_(buffer, "sum", group)

    try:
        call()
        torch.cuda.synchronize()
        hashes = [None] * world
        dist.all_gather_object(hashes, hashlib.sha256(buffer.cpu().view(torch.int16).numpy().tobytes()).hexdigest())
        return {"two_shot_equals_one_shot": bool(torch.equal(buffer, one_shot)),
                "two_shot_same_on_every_rank": len(set(hashes)) == 1, "two_shot_us": _us(call)}
    except (RuntimeError, AttributeError) as exc:  # a torch without the op, or a size it refuses
        return {"two_shot_error": str(exc).strip().splitlines()[0][:160]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        if world > torch.cuda.device_count():
            continue
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        mp.spawn(_rank, args=(world, free_port(), batches, queue), nprocs=world, join=True)
        rows += queue.get()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "allreduce_latency.json").write_text(json.dumps(rows, indent=1))
    print("| W | B | NCCL us | invariant us | gather us | one-shot bf16 us | one-shot same on every rank "
          "| one-shot == invariant | two-shot us | two-shot == one-shot, same on every rank |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- |")
    for r in rows:
        two = (f"{r['two_shot_us']:.1f} | {r['two_shot_equals_one_shot']}, {r['two_shot_same_on_every_rank']}"
               if "two_shot_us" in r else f"- | {r.get('two_shot_error')}")
        print(f"| {r['world']} | {r['batch']} | {r['nccl_us']:.1f} | {r['invariant_us']:.1f} | {r['gather_us']:.1f} "
              f"| {r['one_shot_us']:.1f} | {r['one_shot_same_on_every_rank']} | {r['one_shot_equals_invariant']} | {two} |")
    print("the invariant all-reduce's route: " + ", ".join(sorted({r["route"] for r in rows})))
    for world in sorted({r["world"] for r in rows}):  # batch invariance: row 0's sum at every batch size
        row0 = {r["batch"]: r["one_shot_row0"] for r in rows if r["world"] == world}
        print(f"W = {world}: one-shot row 0 {'the same' if len(set(row0.values())) == 1 else 'DIFFERS'} "
              f"across B = {', '.join(map(str, row0))} ({', '.join(row0.values())})")


if __name__ == "__main__":
    main()
