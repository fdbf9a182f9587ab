"""The host's cost of launching one CUDA graph, by what its nodes are: why TP2's graph launch costs more.

    python3 scripts/device/gpu_graph_launch.py [--world 2] [--kernels 823] [--out DIR]

Why: in the compiled TP2 decode step of the 8B shape at B = 64 (2 x H200, 2026-11-30) the graph launch's
host call took 1.08 ms against TP1's 0.69 ms, for 899 kernels against 823: more than the 76 extra nodes
explain at TP1's rate. The step is the host's part, then the GPU's (generate synchronises every step), so
this host time is step time. Each rank captures graphs of `--kernels` small elementwise kernels (the
step's count at TP1) plus, per row, what TP2 adds: 73 symmetric-memory one-shot all-reduces of (64, 4096)
bf16 (the mode's), 73 NCCL all-reduces (the default's), or one NCCL all-gather (the lm_head's), and times
`graph.replay()` on the host (the call only: a synchronise between replays, the ranks aligned on a
barrier), median of 50. Prints a Markdown table (rank 0), writes $OUT/graph_launch.json.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from nondet.probes.tp.group import free_port  # noqa: E402

ROWS, HIDDEN, COLLECTIVES = 64, 4096, 73  # a B = 64 step's activations; 2 all-reduces a layer x 36 + the embedding's


def launch_us(body, replays: int = 50) -> float:
    """Host microseconds of graph.replay() for a graph of body(), the ranks aligned before each replay."""
    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    times = []
    for _ in range(replays):
        dist.barrier()
        torch.cuda.synchronize()
        started = time.perf_counter()
        graph.replay()
        times.append((time.perf_counter() - started) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def _rank(rank: int, world: int, port: int, kernels: int, queue) -> None:
    import torch.distributed._symmetric_memory as symm_mem

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    group = dist.group.WORLD.group_name
    x = torch.randn(ROWS, HIDDEN, device="cuda").bfloat16()
    small = torch.zeros(ROWS, 64, device="cuda")
    buffer = symm_mem.empty((ROWS, HIDDEN), dtype=torch.bfloat16, device="cuda")
    symm_mem.rendezvous(buffer, group)
    gathered = torch.empty(world * ROWS, HIDDEN, device="cuda", dtype=torch.bfloat16)

    def plain():
        for _ in range(kernels):
            small.add_(1.0)

    def with_one_shot():
        plain()
        for _ in range(COLLECTIVES):
            torch.ops.symm_mem.one_shot_all_reduce_copy(buffer, x, "sum", group)

    def with_nccl():
        plain()
        for _ in range(COLLECTIVES):
            dist.all_reduce(x)

    def with_gather():
        plain()
        dist.all_gather_into_tensor(gathered, x)

    rows = {name: launch_us(body) for name, body in
            [("plain", plain), ("one_shot", with_one_shot), ("nccl_all_reduce", with_nccl),
             ("nccl_all_gather", with_gather)]}
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--kernels", type=int, default=823, help="small kernels in every graph (TP1's step: 823)")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    queue = mp.get_context("spawn").Queue()
    mp.spawn(_rank, args=(args.world, free_port(), args.kernels, queue), nprocs=args.world, join=True)
    rows = queue.get()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "graph_launch.json").write_text(json.dumps(rows, indent=1))
    print(f"| graph (W = {args.world}, {args.kernels} small kernels +) | host us of graph.replay() |")
    print("| --- | ---: |")
    for name, us in rows.items():
        print(f"| {name} | {us:.0f} |")


if __name__ == "__main__":
    main()
