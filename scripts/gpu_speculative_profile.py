"""Where a speculative round's time goes on the compiled path, per kernels mode.

    python3 scripts/gpu_speculative_profile.py [--tokens 96] [--damp 0.02]
    python3 scripts/gpu_speculative_profile.py --case tiny --device cpu --tokens 12   # smoke run

The case of `bench_speculative.py --case wide --damp F --compile`: a random Qwen3 with the 8B widths
and 16 layers whose layers past the second are damped, its first 2 layers as the draft (K = 4), one
built-in prompt, greedy. Per kernels mode (default, then the mode with traceable=True), after a
warm-up call of each: plain and speculative decoding's wall ms per token (median of --repeats calls), GPU ms per token (sum of
the kernels' time, torch.profiler), the rounds, the heaviest kernels (`--kernels N`), and the host functions that take the speculative
call's time (cProfile, by cumulative and own time). Wall minus GPU time is what the host adds.
`--walls` prints every measured call's ms per token; `--prefill` times a 1-token call (the eager prefill
alone) per kernels mode, the rounds' ms past it, and a loop of small torch calls on the device made
inside the mode's scope (between compiled calls: is the host slower there?); `--trace DIR` writes a chrome trace (CPU and CUDA
events, gzip) of one call per kernels mode and decoding, for scripts/trace_steps.py.
"""

import argparse
import contextlib
import cProfile
import gzip
import io
import json
import pstats
import statistics
import time
from pathlib import Path

import torch

from bench_speculative import CASES, damped_target_dir
from gpu_host_scope import small_calls_us
from nondet.probes.batch import Batch, tokenize_inputs
from nondet.probes.compiled import compile_scope
from nondet.probes.compiled_draft import static_drafts
from nondet.probes.corpus import DEMO_PROMPTS
from nondet.probes.default_draft import build_draft
from nondet.probes.loading import ModelSpec, load_model
from nondet.probes.replay import Assist, DecodeSettings, generate
from nondet.probes.sources.speculative import RoundLog, drafting
from nondet.probes.sources.static import COMPILED_CALLS, kernels_mode

K = 4


def decode(target, draft, tokenizer, ids, tokens: int, spec: bool):
    """One greedy generate on the compiled path -> (new tokens, RoundLog)."""
    backend = "inductor" if target.device.type == "cuda" else "aot_eager"
    settings = DecodeSettings(max_new_tokens=tokens, temperature=0.0, seed=0, compile_backend=backend)
    batch = Batch(input_ids=[ids], attention_mask=[[1] * len(ids)], target_rows=(0,))
    rounds = RoundLog(len(ids))
    assist = Assist(assistant=draft, drafted=K) if spec else Assist(drafted=K)
    with (drafting(draft, K) if spec else contextlib.nullcontext()), \
         (static_drafts(target, K) if spec else contextlib.nullcontext()), rounds.watching(target):
        out = generate(target, tokenizer, batch, settings, None, stopping=[rounds], assist=assist)
    if target.device.type == "cuda":
        torch.cuda.synchronize()
    return out.sequences.shape[-1] - len(ids), rounds


@contextlib.contextmanager
def fresh_caches(fresh: bool):
    """With `fresh`, every generate call gets a new static cache, as transformers makes one (the
    comparison for static_caches.py's held cache)."""
    from nondet.probes import static_caches

    held = static_caches.static_cache

    def new_each_time(model, batch_size, max_cache_len):
        static_caches._HELD.pop(model, None)
        return held(model, batch_size, max_cache_len)

    static_caches.static_cache = new_each_time if fresh else held
    try:
        yield
    finally:
        static_caches.static_cache = held


def gpu_ms(call) -> tuple[float, list]:
    """(total kernel time of call() in ms, [(kernel, ms, calls)] heaviest first) (torch.profiler, CUDA only)."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return 0.0, []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    events.sort(key=lambda e: -e.self_device_time_total)
    return (sum(e.self_device_time_total for e in events) / 1e3,
            [(e.key, e.self_device_time_total / 1e3, e.count) for e in events])


def median_ms(call, repeats: int) -> float:
    """Median wall ms of call() (one warm-up call first)."""
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def write_trace(call, path: Path) -> None:
    """A chrome trace of call() (CPU ops and CUDA kernels, torch.profiler), gzip-compressed, with the
    tokens the call made as its "tokens" field (scripts/trace_steps.py reports per token)."""
    from torch.profiler import ProfilerActivity, profile

    path.parent.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        made, _ = call()
    plain = path.with_suffix("")  # export_chrome_trace writes plain JSON
    prof.export_chrome_trace(str(plain))
    trace = json.loads(plain.read_text())
    trace["tokens"] = made
    with gzip.open(path, "wt") as out:
        json.dump(trace, out)
    plain.unlink()


def host_top(call, n: int = 25) -> str:
    """The host functions of call() by cumulative and by own time (cProfile)."""
    profiler = cProfile.Profile()
    profiler.enable()
    call()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(n)
    stats.sort_stats("tottime").print_stats(15)
    return "\n".join(line for line in text.getvalue().splitlines() if line.strip())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--damp", type=float, default=0.02)
    parser.add_argument("--case", choices=sorted(CASES), default="wide")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of this script")
    parser.add_argument("--modes", default="default,batch-invariant")
    parser.add_argument("--caches", default="held", help="held,fresh: also time a new static cache per call")
    parser.add_argument("--no-host", action="store_true", help="skip the cProfile run")
    parser.add_argument("--host-of", default="speculative", choices=("speculative", "plain"),
                        help="which decoding's call cProfile looks at")
    parser.add_argument("--kernels", type=int, default=0, help="also the N heaviest kernels per decoding (us / token)")
    parser.add_argument("--repeats", type=int, default=3, help="measured calls (the median is printed)")
    parser.add_argument("--prefill", action="store_true",
                        help="time the prefill alone (a 1-token call), the rounds past it, and small torch calls")
    parser.add_argument("--walls", action="store_true", help="print every measured call's ms per token")
    parser.add_argument("--trace", help="a folder: one chrome trace (.json.gz) per kernels mode and decoding")
    parser.add_argument("--traced", default="compiled_calls", choices=("compiled_calls", "body"),
                        help="the mode traced inside generate's compiled forwards (the probe's path) or the whole call")
    args = parser.parse_args()
    target_dir = damped_target_dir(CASES[args.case], 2, args.damp)
    draft_dir = target_dir.with_name(target_dir.name + "-draft")
    if not (draft_dir / "nondet-draft.json").exists():
        build_draft(target_dir, 2, draft_dir)
    target = load_model(ModelSpec(name=str(target_dir), device=args.device))
    draft = load_model(ModelSpec(name=str(draft_dir), device=args.device))
    ids = tokenize_inputs(target.tokenizer, DEMO_PROMPTS[0], ())[0]
    print(torch.cuda.get_device_name() if args.device == "cuda" else args.device, "torch", torch.__version__, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print(f"the mode traced: {args.traced}")
    print("| kernels | static caches | decoding | tokens | rounds | acceptance | wall ms / token | GPU ms / token | "
          "host ms / token |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
    hosts, tops = {}, {}
    for mode in args.modes.split(","):
        for caches in args.caches.split(","):
            traceable = True if args.traced == "body" else COMPILED_CALLS
            with kernels_mode(mode, target.model, traceable=traceable), compile_scope(), fresh_caches(caches == "fresh"):
                prefill = None
                if args.prefill:
                    prefill = median_ms(lambda: decode(target.model, draft.model, target.tokenizer, ids, 1, False), 5)
                    print(f"  {mode}: prefill (a 1-token call) {prefill:.2f} ms; a loop of small torch calls "
                          f"{small_calls_us(target.model.device):.1f} us", flush=True)
                for spec in (False, True):
                    run = lambda: decode(target.model, draft.model, target.tokenizer, ids, args.tokens, spec)  # noqa: E731
                    run()  # warm-up: compile and CUDA-graph capture of every shape
                    walls = []
                    for _ in range(args.repeats):
                        started = time.perf_counter()
                        made, rounds = run()
                        walls.append((time.perf_counter() - started) * 1e3 / made)
                    wall = statistics.median(walls)
                    decoding = 'speculative' if spec else 'plain'
                    if prefill is not None:
                        print(f"  {mode} {decoding}: past the prefill "
                              f"{(wall * made - prefill) / len(rounds.produced):.2f} ms per round of "
                              f"{made / len(rounds.produced):.2f} tokens", flush=True)
                    if args.walls:
                        print(f"  {mode} {decoding}: ms / token per call " + " ".join(f"{w:.2f}" for w in walls), flush=True)
                    if args.trace:
                        write_trace(run, Path(args.trace) / f"trace-{mode}-{decoding}.json.gz")
                    total, kernels = gpu_ms(run)
                    gpu = total / made
                    print(f"| {mode} | {caches} | {decoding} | {made} | {len(rounds.produced)} | "
                          f"{rounds.rate() if spec else '-'} | {wall:.2f} | {gpu:.2f} | {wall - gpu:.2f} |", flush=True)
                    if args.kernels:
                        tops[f"{mode}, {decoding}"] = "; ".join(
                            f"{name[:60]} {ms * 1e3 / made:.1f} us x{calls / made:.1f}" for name, ms, calls in kernels[:args.kernels])
                    if spec == (args.host_of == "speculative") and not args.no_host:
                        hosts[f"{mode}, {caches} caches"] = host_top(run)
    for label, text in tops.items():
        print(f"\nheaviest kernels, {label} (GPU us per token, launches per token): {text}", flush=True)
    for mode, text in hosts.items():
        print(f"\nhost time of one {args.host_of} call, {mode} (cProfile):\n{text}", flush=True)


if __name__ == "__main__":
    main()
