"""The host time the mode adds to a compiled, CUDA-graphed decode step, where the GPU work is small.

    python3 scripts/gpu_compiled_host.py [--layers 2] [--tokens 32]

The 8B widths with few layers (the speculative case's draft has 2), B = 1, static cache, transformers'
compiled decode; the mode as the probe runs it (traceable="compiled_calls": the TorchFunctionMode
entered around each compiled forward). Per kernels mode: ms per decode step, and from cProfile of
one generate call: Python function calls per step, the mode's __torch_function__ calls per step at
run time (after compile and graph capture) and their callers, and the heaviest functions by own time
(by cumulative time too, `--cumulative N`, and the callers of named functions, `--callers-of`).
`--events MODE`: one kernels mode per process, torch.profiler's CPU events per step; `--gaps MODE`: the
GPU's busy and idle time per step.
"""

import argparse
import contextlib
import cProfile
import io
import pstats
import time

import torch

from gpu_compile import build, generate, step_ms


def profiled(call) -> pstats.Stats:
    profiler = cProfile.Profile()
    profiler.enable()
    call()
    torch.cuda.synchronize()
    profiler.disable()
    return pstats.Stats(profiler)


def prompt() -> torch.Tensor:
    """(1, 16) token ids, the same every call."""
    return torch.randint(3, 32000, (1, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(1))


def kernels(model, mode: bool):
    """The mode as the probe's compiled path enters it, or nothing (default kernels)."""
    from nondet.kernels import batch_invariant

    return batch_invariant(model=model, traceable="compiled_calls") if mode else contextlib.nullcontext()


def step_and_profile(model, label: str, tokens: int, activity, warm: bool = False):
    """(ms per decode step, torch.profiler of one generate call with `activity`) for one kernels mode;
    warm: one more generate of the prompt first, so the profiled call records no graph."""
    from torch.profiler import profile

    ids = prompt()
    with torch.no_grad(), kernels(model, label == "mode"):
        _, ms = step_ms(model, 1, tokens, repeats=5)
        if warm:
            generate(model, ids, tokens + 1, True)
        with profile(activities=[activity]) as prof:
            generate(model, ids, tokens + 1, True)
            torch.cuda.synchronize()
    return ms, prof


def mode_calls(stats: pstats.Stats) -> tuple[int, dict]:
    """(calls of TracedMode.__torch_function__, {caller: calls})."""
    for (path, _, name), (_, calls, _, _, callers) in stats.stats.items():
        if name == "__torch_function__" and path.endswith("traced.py"):
            return calls, {f"{p.rsplit('/', 1)[-1]}:{line}({fn})": c[0] for (p, line, fn), c in callers.items()}
    return 0, {}


@contextlib.contextmanager
def without_squares():
    """The mode as before squares.py: no tags, no write marks (the A/B of --ab-squares)."""
    from nondet.kernels import squares

    taggers, in_place = squares.TAGGERS, squares.in_place_functions
    squares.TAGGERS, squares.in_place_functions = {}, dict
    try:
        yield
    finally:
        squares.TAGGERS, squares.in_place_functions = taggers, in_place


def ab_squares(model, tokens: int) -> None:
    """ms per decode step, interleaved: default, the mode, the mode without squares.py, ..."""
    order = ["default", "mode", "mode without squares.py", "mode", "mode without squares.py", "default"]
    for label in order:
        torch._dynamo.reset()
        with torch.no_grad(), (without_squares() if "without" in label else contextlib.nullcontext()), \
                kernels(model, label != "default"):
            _, ms = step_ms(model, 1, tokens, repeats=5)
        print(f"{label}: {ms:.2f} ms / decode step", flush=True)


def host_events(model, label: str, tokens: int, top: int) -> None:
    """One kernels mode in this process (a fresh one per mode: step times drift as compiles accumulate):
    ms per decode step, then torch.profiler's CPU events of one generate call, per step, by total time
    (dynamo's cache lookup, the compiled region, the cudagraph replay, aten ops the loop runs)."""
    from torch.profiler import ProfilerActivity

    ms, prof = step_and_profile(model, label, tokens, ProfilerActivity.CPU)
    steps = tokens + 1
    events = sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total)[:top]
    print(f"{label}: {ms:.2f} ms / decode step; CPU events per step (name, total us, self us, calls):", flush=True)
    for e in events:
        print(f"  {e.key[:70]:70s} {e.cpu_time_total / steps:9.1f} {e.self_cpu_time_total / steps:9.1f} "
              f"{e.count / steps:6.1f}", flush=True)


def gaps(model, label: str, tokens: int) -> None:
    """One kernels mode in this process: per decode step, the kernels' time (their union) and the GPU's
    idle time between kernels split at 20 us as trace_steps.py splits it (short: between kernels of one
    replayed graph; long: waiting for the host), from torch.profiler's CUDA activity over one generate call."""
    from torch.profiler import ProfilerActivity
    from trace_steps import idle_us, union_us

    ms, prof = step_and_profile(model, label, tokens, ProfilerActivity.CUDA, warm=True)
    spans = sorted(((e.time_range.start, e.time_range.end, None) for e in prof.events()
                    if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start), key=lambda s: s[:2])
    busy = union_us(spans)
    short, long = idle_us(spans)
    steps = tokens + 1
    print(f"{label}: {ms:.2f} ms / decode step; per step: kernels {busy / steps / 1e3:.2f} ms in {len(spans) / steps:.0f} "
          f"kernels, idle between kernels {short / steps / 1e3:.2f} ms in gaps < 20 us, {long / steps / 1e3:.2f} ms "
          f"in longer ones", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--cumulative", type=int, default=0, help="also the N heaviest functions by cumulative time")
    parser.add_argument("--callers-of", nargs="*", default=[], help="print_callers of these function names (regex)")
    parser.add_argument("--width", type=int, default=3500, help="characters of each listing kept")
    parser.add_argument("--ab-squares", action="store_true", help="only ms per step, the mode with and without squares.py")
    parser.add_argument("--events", choices=("default", "mode"),
                        help="only this kernels mode: ms per step and torch.profiler's CPU events per step")
    parser.add_argument("--top", type=int, default=30, help="events printed with --events")
    parser.add_argument("--gaps", choices=("default", "mode"),
                        help="only this kernels mode: per step, kernel time and the GPU's idle time between kernels")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          flush=True)
    model = build(args.layers)
    if args.ab_squares:
        return ab_squares(model, args.tokens)
    if args.events:
        return host_events(model, args.events, args.tokens, args.top)
    if args.gaps:
        return gaps(model, args.gaps, args.tokens)
    ids = prompt()
    for label in ("default", "mode"):
        torch._dynamo.reset()
        with torch.no_grad(), kernels(model, label == "mode"):
            _, ms = step_ms(model, 1, args.tokens)
            stats = profiled(lambda: generate(model, ids, args.tokens + 1, True))
        steps = args.tokens + 1
        calls, callers = mode_calls(stats)
        print(f"\n{label}: {ms:.2f} ms / decode step; Python calls / step {stats.total_calls / steps:.0f}; "
              f"the mode's __torch_function__ / step {calls / steps:.1f}", flush=True)
        if callers:
            top = sorted(callers.items(), key=lambda kv: -kv[1])[:12]
            print("  called from (per step): " + "; ".join(f"{k} {v / steps:.1f}" for k, v in top))
        print(listing(stats, "tottime", 18, args.width), flush=True)
        print(listing(stats, "cumulative", args.cumulative, args.width), flush=True)
        for name in args.callers_of:
            print(captured(stats, lambda: stats.print_callers(name), 2500), flush=True)


def listing(stats: pstats.Stats, key: str, n: int, width: int) -> str:
    return captured(stats, lambda: stats.sort_stats(key).print_stats(n), width)


def captured(stats: pstats.Stats, show, width: int) -> str:
    """What show() (a pstats printing call on stats) prints, blank lines dropped, its last `width` characters."""
    text = io.StringIO()
    stats.stream = text
    show()
    return "\n".join(line for line in text.getvalue().splitlines() if line.strip())[-width:]


if __name__ == "__main__":
    main()
