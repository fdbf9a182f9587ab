"""Where a compiled decode step's time goes, from a torch profiler Chrome trace (.json or .json.gz).

One step = one `Torch-Compiled Region` call on the host; its GPU work = the kernels that start before the next
call. Per step: the host's part before the GPU starts (guards, graph launch), the kernels' busy time, their
span, and the idle gaps inside it; then the median step's kernels by name. Written for
gpu_tp_speed.py's NONDET_TP_TRACE=1 (rank 0 of a TP run, or one GPU):

    python3 scripts/device/trace_steps.py $OUT/tp2_trace_compiled_batch-invariant_b64.json.gz

A step whose span exceeds 3x the median (a graph recorded again, a warm-up) is left out of the medians.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import statistics


def load_events(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        trace = json.load(handle)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def steps(events: list[dict]) -> list[dict]:
    """Each compiled call with the kernels launched until the next one (us, trace clock)."""
    regions = sorted((e for e in events if str(e.get("name", "")).startswith("Torch-Compiled Region")),
                     key=lambda e: e["ts"])
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    launches = sorted((e for e in events if e.get("name") == "cudaGraphLaunch"), key=lambda e: e["ts"])
    out = []
    for i, region in enumerate(regions[:-1]):
        start, end = region["ts"], regions[i + 1]["ts"]
        mine = [k for k in kernels if start <= k["ts"] < end]
        if not mine:
            continue
        launch = next((g for g in launches if start <= g["ts"] < end), None)
        busy = sum(k["dur"] for k in mine)
        span = mine[-1]["ts"] + mine[-1]["dur"] - mine[0]["ts"]
        gaps = sorted(mine[j + 1]["ts"] - (mine[j]["ts"] + mine[j]["dur"]) for j in range(len(mine) - 1))
        out.append({"step_ms": (end - start) / 1e3, "region_ms": region["dur"] / 1e3,
                    "host_before_gpu_ms": (mine[0]["ts"] - start) / 1e3,
                    "graph_launch_ms": launch["dur"] / 1e3 if launch else None,
                    "kernels": len(mine), "busy_ms": busy / 1e3, "span_ms": span / 1e3,
                    "gaps_over_50us_ms": sum(g for g in gaps if g > 50) / 1e3,
                    "gaps_under_50us_ms": sum(g for g in gaps if g <= 50) / 1e3, "_kernels": mine})
    return out


def steady(all_steps: list[dict]) -> list[dict]:
    median_span = statistics.median(s["span_ms"] for s in all_steps)
    return [s for s in all_steps if s["span_ms"] <= 3 * median_span]


def by_kernel(step: dict, top: int) -> list[tuple[str, int, float]]:
    """(name, calls, ms) of one step's kernels, largest time first."""
    table = collections.defaultdict(lambda: [0, 0.0])
    for k in step["_kernels"]:
        row = table[k["name"][:80]]
        row[0] += 1
        row[1] += k["dur"] / 1e3
    return sorted(((n, c, ms) for n, (c, ms) in table.items()), key=lambda r: -r[2])[:top]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=12, help="kernels listed for the median step")
    args = p.parse_args()
    kept = steady(steps(load_events(args.trace)))
    fields = [f for f in kept[0] if not f.startswith("_")]
    print(f"{len(kept)} steady steps of {args.trace}; medians (ms):")
    for field in fields:
        values = [s[field] for s in kept if s[field] is not None]
        print(f"  {field}: {statistics.median(values):.3f}" if values else f"  {field}: -")
    middle = sorted(kept, key=lambda s: s["span_ms"])[len(kept) // 2]
    print("median step's kernels: calls, ms, name")
    for name, calls, ms in by_kernel(middle, args.top):
        print(f"  {calls:5d} {ms:8.3f}  {name}")


if __name__ == "__main__":
    main()
