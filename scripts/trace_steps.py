"""Where a decode call's wall time goes, from a chrome trace of it (torch.profiler, CPU and CUDA events).

    python3 scripts/trace_steps.py TRACE.json.gz [TRACE ...] [--per 96] [--top 20]

Written by `scripts/gpu_speculative_profile.py --trace DIR`. Per trace, in ms per token (the trace's
"tokens" field, else `--per`): the call's span; the GPU's kernel time, its idle time between kernels
split at 20 us (short: inside a replayed graph; long: waiting for the host); the host's time inside
top-level CPU ops and CUDA runtime calls and the time in neither (Python between torch calls); then
the heaviest top-level CPU ops and runtime calls by total time, with their calls per `--per`.
No torch needed: it reads the JSON.
"""

import argparse
import gzip
import json
from collections import defaultdict

SHORT_GAP_US = 20.0


def load(path: str) -> tuple[list[dict], int | None]:
    """(the complete events, the trace's "tokens" field or None)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        trace = json.load(handle)
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e], trace.get("tokens")


def spans(events: list[dict], cats: set[str]) -> list[tuple[float, float, dict]]:
    """(start us, end us, event) of the events in these categories, by start."""
    return sorted(((e["ts"], e["ts"] + e["dur"], e) for e in events if e.get("cat") in cats), key=lambda s: s[0])


def top_level(intervals: list[tuple[float, float, dict]]) -> list[tuple[float, float, dict]]:
    """The intervals not inside an earlier one of the same thread (an op's children dropped)."""
    kept, ends = [], {}
    for start, end, event in intervals:
        tid = event.get("tid")
        if start < ends.get(tid, float("-inf")):
            continue
        kept.append((start, end, event))
        ends[tid] = end
    return kept


def union_us(intervals: list[tuple[float, float, dict]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end, _ in sorted(intervals, key=lambda s: s[0]):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def by_name(intervals: list[tuple[float, float, dict]]) -> dict[str, tuple[float, int]]:
    table = defaultdict(lambda: [0.0, 0])
    for start, end, event in intervals:
        table[event["name"]][0] += end - start
        table[event["name"]][1] += 1
    return {name: (total, count) for name, (total, count) in table.items()}


def summary(path: str, per: int, top: int) -> str:
    events, tokens = load(path)
    per = tokens or per
    kernels = spans(events, {"kernel", "gpu_memcpy", "gpu_memset"})
    host_ops = top_level(spans(events, {"cpu_op", "user_annotation"}))
    runtime = top_level(spans(events, {"cuda_runtime", "cuda_driver"}))
    everything = kernels + host_ops + runtime
    first, last = min(s for s, _, _ in everything), max(e for _, e, _ in everything)
    busy = union_us(kernels)
    short, long = idle_us(kernels)
    host_busy = union_us(host_ops + runtime)
    ms = lambda us: us / per / 1e3  # noqa: E731
    lines = [f"{path}: per {per}: span {ms(last - first):.2f} ms; GPU kernels {ms(busy):.2f} ms in "
             f"{len(kernels) / per:.0f} kernels, idle {ms(short):.2f} ms in gaps < {SHORT_GAP_US:.0f} us, "
             f"{ms(long):.2f} ms in longer ones; host in torch ops or runtime calls "
             f"{ms(host_busy):.2f} ms, in neither {ms(last - first - host_busy):.2f} ms"]
    for title, intervals in (("top-level CPU ops", host_ops), ("CUDA runtime calls", runtime)):
        rows = sorted(by_name(intervals).items(), key=lambda kv: -kv[1][0])[:top]
        lines.append(f"  {title} (ms, calls, per {per}): " + "; ".join(
            f"{name[:48]} {ms(total):.3f} x{count / per:.1f}" for name, (total, count) in rows))
    return "\n".join(lines)


def idle_us(kernels: list[tuple[float, float, dict]]) -> tuple[float, float]:
    """(us, us): the GPU's idle time between kernels (sorted by start) in gaps < SHORT_GAP_US and longer."""
    idle = [b[0] - a for a, b in zip(_reaches(kernels), kernels[1:]) if b[0] > a]
    short = sum(g for g in idle if g < SHORT_GAP_US)
    return short, sum(idle) - short


def _reaches(kernels: list[tuple[float, float, dict]]) -> list[float]:
    """The latest end among kernels[0..i], for each i: a gap is idle only past every earlier kernel."""
    reach, out = float("-inf"), []
    for _, end, _ in kernels:
        reach = max(reach, end)
        out.append(reach)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--per", type=int, default=1, help="divide by this where a trace has no tokens field")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    for path in args.traces:
        print(summary(path, args.per, args.top), flush=True)


if __name__ == "__main__":
    main()
