"""The mode on the compiled path: an 8B-shaped random Qwen3 (hidden 4096, 32 / 8 heads, bf16) decoded
by HF generate with a static cache, which transformers compiles (CUDA graphs) on CUDA.

    python3 scripts/device/gpu_compile.py [--layers 36] [--tokens 32] [--moe]

--moe: a Qwen3-30B-A3B-shaped mixture of experts instead (hidden 2048, 128 experts, top-8, expert width
768, 32 / 4 heads of 128); its roofline counts the weights one token reads (8 of 128 experts).

Per kernels mode (default; the mode with traceable=True): compile + warm-up time, ms per decode
step at B = 1 and B = 32, the weight-read roofline at B = 1, and whether the compiled mode's greedy
logits equal the eager mode's (dynamic cache, no compile) bit for bit at B = 1 and row 0 of B = 8.
Then the prefill of 512 tokens (eager, as transformers runs it; compiled; compiled and replayed as
a CUDA graph, with the compiled mode's logits checked against the eager mode's), and
the GPU time of a B = 1 and a B = 32 decode step by kernel, default vs the mode (`--profile`), which names the
kernels the mode's step loses its time in.
"""

import argparse
import statistics
import time

import torch

HBM = {"H200": 4.8e12, "H100": 3.35e12}


def build(layers: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=32000, hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                      pad_token_id=0, eos_token_id=2, bos_token_id=1)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    return model


def build_moe(layers: int):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=32000, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                         num_experts=128, num_experts_per_tok=8, num_hidden_layers=layers, num_attention_heads=32,
                         num_key_value_heads=4, head_dim=128, decoder_sparse_step=1, mlp_only_layers=[],
                         max_position_embeddings=4096, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    with torch.no_grad():  # spread the router and the experts (random init leaves some at zero)
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    return model


def read_bytes(model) -> int:
    """Bytes of weights one token's decode step reads: all of a dense model; a MoE's top-k experts only."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.config
    experts = getattr(cfg, "num_experts", None)
    if not experts:
        return total
    expert_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    return total - expert_bytes + expert_bytes * cfg.num_experts_per_tok // experts


def generate(model, ids, tokens: int, static: bool, logits: bool = False):
    kwargs = dict(cache_implementation="static") if static else dict(disable_compile=True)
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                          do_sample=False, pad_token_id=0, output_logits=logits, return_dict_in_generate=logits,
                          **kwargs)


def timed(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


class _StepClock:
    """A generate streamer that notes the time each new token reaches the host (generate syncs the
    device every step on CUDA, so the gaps between tokens are the decode steps' wall time)."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def step_ms(model, batch: int, tokens: int, repeats: int = 3) -> tuple[float, float]:
    """(compile + warm-up s, ms per decode step): the median gap between consecutive tokens over
    `repeats` generate calls of tokens + 1 tokens (the first gap, after the prefill, is left out)."""
    ids = torch.randint(3, 32000, (batch, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    warm = timed(lambda: generate(model, ids, tokens + 1, True))  # compile, capture the graphs
    gaps = []
    for _ in range(repeats):
        clock = _StepClock()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens + 1, min_new_tokens=tokens + 1,
                       do_sample=False, pad_token_id=0, cache_implementation="static", streamer=clock)
        times = clock.times[2:]  # [0] is the prompt, [1] the first token (after the prefill)
        gaps += [b - a for a, b in zip(times, times[1:])]
    return warm, statistics.median(gaps) * 1e3


def bits(model) -> str:
    from nondet.kernels import batch_invariant

    ids = torch.randint(3, 32000, (8, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    with torch.no_grad(), batch_invariant(model=model, traceable=True):
        eager1 = generate(model, ids[:1], 8, False, True).logits
        comp1 = generate(model, ids[:1], 8, True, True).logits
        comp8 = generate(model, ids, 8, True, True).logits
    same = all(torch.equal(a, b) for a, b in zip(eager1, comp1))
    inv = all(torch.equal(a[0], b[0]) for a, b in zip(comp1, comp8))
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(eager1, comp1))
    return f"compiled mode == eager mode at B=1: {same} (max |diff| {diff:.3g}); compiled B=1 == row 0 of B=8: {inv}"


def prefill_ms(model, tokens: int = 512, repeats: int = 5) -> float:
    """One eager forward over a [1, tokens] prompt (no cache), ms, best of `repeats` after a warm-up."""
    ids = torch.randint(3, 32000, (1, tokens), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    forward = lambda: model(ids, use_cache=False)  # noqa: E731
    forward()
    return min(timed(forward) for _ in range(repeats)) * 1e3


def compiled_prefill(model, mode: bool, graphs: bool = False, tokens: int = 512, repeats: int = 5):
    """The same prefill through torch.compile (Inductor; with `graphs`, replayed as a CUDA graph,
    mode="reduce-overhead", as engines capture their batch shapes), the mode traceable; checks the
    compiled mode's logits against the eager mode's. -> (best ms, the profile of one more call)."""
    from torch.profiler import ProfilerActivity, profile

    from nondet.kernels import batch_invariant

    torch._dynamo.reset()
    forward = torch.compile(model.forward, dynamic=False, mode="reduce-overhead" if graphs else None)
    ids = torch.randint(3, 32000, (1, tokens), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    with torch.no_grad(), (batch_invariant(model=model, traceable=True) if mode else torch.no_grad()):
        first = forward(ids, use_cache=False).logits.clone()
        if mode:  # the compiled mode's prefill against the eager mode's, bit for bit
            eager = model(ids, use_cache=False).logits
            print(f"compiled mode prefill{' (CUDA graphs)' if graphs else ''} == eager mode prefill: "
                  f"{torch.equal(first, eager)} (max |diff| {(first.float() - eager.float()).abs().max().item():.3g})",
                  flush=True)
        forward(ids, use_cache=False)
        best = min(timed(lambda: forward(ids, use_cache=False)) for _ in range(repeats)) * 1e3
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            forward(ids, use_cache=False)
            torch.cuda.synchronize()
    return best, prof


def compiled_prefill_ms(model, mode: bool, graphs: bool = False) -> float:
    """compiled_prefill's best ms; without graphs it also prints the GPU / CPU time by op."""
    best, prof = compiled_prefill(model, mode, graphs)
    if graphs:
        return best
    rows = sorted(((e.key, e.device_time_total / 1e3, e.cpu_time_total / 1e3, e.count) for e in prof.key_averages()),
                  key=lambda r: -max(r[1], r[2]))[:12]
    print(f"compiled prefill, {'mode' if mode else 'default'}, by op (name, GPU ms, CPU ms, calls): "
          + "; ".join(f"{n[:50]} {g:.2f} {c:.2f} {k}" for n, g, c, k in rows), flush=True)
    return best


def print_graph_breaks(model, tokens: int = 512) -> None:
    """Why the mode's compiled prefill splits into several graphs (torch._dynamo.explain)."""
    from nondet.kernels import batch_invariant

    torch._dynamo.reset()
    ids = torch.randint(3, 32000, (1, tokens), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    try:
        with torch.no_grad(), batch_invariant(model=model, traceable=True):
            explained = torch._dynamo.explain(model.forward)(ids, use_cache=False)
    except Exception as exc:  # noqa: BLE001 - torch 2.11's explain fails on some resumed frames: say so, go on
        print(f"mode prefill under dynamo: explain failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        return
    print(f"mode prefill under dynamo: {explained.graph_count} graphs, {explained.graph_break_count} breaks", flush=True)
    for reason in explained.break_reasons[:6]:
        where = " <- ".join(str(frame).strip()[:120] for frame in reason.user_stack[-2:])
        print(f"  break: {str(reason.reason).strip()[:300]} at {where}", flush=True)


def profile_step(model, batch: int = 32, tokens: int = 8, top: int = 10) -> tuple[list[tuple[str, float]], float]:
    """GPU ms per decode step: by kernel (the `top` heaviest) and in all (eager static cache: the
    kernels the compiled graph replays, minus Inductor's fused elementwise ones)."""
    from torch.profiler import ProfilerActivity, profile

    ids = torch.randint(3, 32000, (batch, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(4))
    run = lambda: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,  # noqa: E731
                                 min_new_tokens=tokens, do_sample=False, pad_token_id=0,
                                 cache_implementation="static", disable_compile=True)
    run()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
    rows = [(e.key, e.device_time_total / 1e3 / tokens) for e in prof.key_averages()
            if e.device_time_total > 0 and not e.key.startswith(("cudaGraph", "Memcpy", "Memset"))]
    return sorted(rows, key=lambda r: -r[1])[:top], sum(ms for _, ms in rows)


def print_decode_profile(model) -> None:
    from nondet.kernels import batch_invariant

    for batch in (1, 32):
        for label in ("default", "mode"):
            with torch.no_grad(), (batch_invariant(model=model) if label == "mode" else torch.no_grad()):
                rows, total = profile_step(model, batch)
            print(f"B={batch} decode step, GPU ms by kernel, {label} (all kernels {total:.2f}): "
                  + "; ".join(f"{name[:60]} {ms:.3f}" for name, ms in rows), flush=True)


def print_compiled_decode_profile(model, tokens: int = 32) -> None:
    """Where a compiled decode step's wall time goes, per kernels mode and batch size: ms per step, GPU
    kernel time per step of the replayed graphs, graph replays and host kernel launches per step,
    cudagraph skips, and the heaviest host ops."""
    from torch._dynamo.utils import counters
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from nondet.kernels import batch_invariant

    torch._logging.set_logs(perf_hints=True)
    for label in ("default", "mode"):
        torch._dynamo.reset()
        counters.clear()
        for batch in (1, 32):
            ids = torch.randint(3, 32000, (batch, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
            with torch.no_grad(), (batch_invariant(model=model, traceable=True) if label == "mode" else torch.no_grad()):
                warm, ms = step_ms(model, batch, tokens)
                with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    generate(model, ids, tokens + 1, True)  # the length step_ms captured: replays only
                    torch.cuda.synchronize()
            events = prof.key_averages()
            gpu = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e3 / tokens
            graphs = sum(e.count for e in events if e.key == "cudaGraphLaunch") / tokens
            launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                                                "cudaLaunchKernelExC")) / tokens
            host = sorted(events, key=lambda e: -e.self_cpu_time_total)[:6]
            print(f"compiled decode B={batch}, {label}: {ms:.2f} ms / step (warm-up {warm:.0f} s), GPU {gpu:.2f} ms / "
                  f"step, {graphs:.1f} graph replays and {launches:.1f} host kernel launches / step, cudagraph skips "
                  f"{counters['inductor'].get('cudagraph_skips', 0)}; host self ms / step: "
                  + "; ".join(f"{e.key[:40]} {e.self_cpu_time_total / 1e3 / tokens:.2f}" for e in host), flush=True)


PREFILL_PATHS = ("eager", "compiled", "graphs")


def print_prefill_and_profile(model, decode: bool = True, paths: tuple[str, ...] = PREFILL_PATHS) -> None:
    from nondet.kernels import batch_invariant

    if "eager" in paths:
        with torch.no_grad():
            default = prefill_ms(model)
            with batch_invariant(model=model):
                mode = prefill_ms(model)
        print(f"prefill 512 tokens (eager): default {default:.2f} ms, mode {mode:.2f} ms: "
              f"{default / mode:.2f}x of default (target >= 0.85x)", flush=True)
    if "compiled" in paths:
        print_graph_breaks(model)
        default, mode = compiled_prefill_ms(model, False), compiled_prefill_ms(model, True)
        print(f"prefill 512 tokens (torch.compile): default {default:.2f} ms, mode {mode:.2f} ms: "
              f"{default / mode:.2f}x of default", flush=True)
    if "graphs" in paths:
        default, mode = compiled_prefill_ms(model, False, graphs=True), compiled_prefill_ms(model, True, graphs=True)
        print(f"prefill 512 tokens (torch.compile + CUDA graphs): default {default:.2f} ms, mode {mode:.2f} ms: "
              f"{default / mode:.2f}x of default", flush=True)
    if decode:
        print_decode_profile(model)


def main() -> None:
    from nondet.kernels import batch_invariant

    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--profile", action="store_true", help="prefill and the per-kernel profile only")
    parser.add_argument("--decode-profile", action="store_true", help="the decode steps' per-kernel profile only")
    parser.add_argument("--prefill", action="store_true", help="the 512-token prefill only (eager, compiled, graphs)")
    parser.add_argument("--prefill-paths", default=",".join(PREFILL_PATHS),
                        help="which prefill rows to time: eager, compiled, graphs (comma-separated)")
    parser.add_argument("--compiled-profile", action="store_true", help="where the compiled decode step's time goes")
    parser.add_argument("--moe", action="store_true", help="a Qwen3-30B-A3B-shaped MoE instead of the 8B shape")
    parser.add_argument("--traceable", default="True", choices=("True", "compiled_calls"),
                        help="the mode's traced scope in the table: the whole generate call, or its compiled forwards")
    args = parser.parse_args()
    traceable = True if args.traceable == "True" else args.traceable
    name = torch.cuda.get_device_name()
    print(name, "torch", torch.__version__, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), flush=True)
    model = build_moe(args.layers) if args.moe else build(args.layers)
    weight_bytes = read_bytes(model)
    bandwidth = next((v for k, v in HBM.items() if k in name), 3.35e12)
    print(f"weights one token reads {weight_bytes / 1e9:.2f} GB: {weight_bytes / bandwidth * 1e3:.2f} ms to read at "
          f"{bandwidth / 1e12:.2f} TB/s", flush=True)
    if args.profile or args.prefill:
        return print_prefill_and_profile(model, decode=args.profile, paths=tuple(args.prefill_paths.split(",")))
    if args.decode_profile:
        return print_decode_profile(model)
    if args.compiled_profile:
        return print_compiled_decode_profile(model, args.tokens)
    print(f"the mode traced: {'the whole generate call' if traceable is True else 'its compiled forwards only'}")
    print("| kernels | B | compile + warm-up s | ms / decode step | x roofline |", flush=True)
    print("| --- | ---: | ---: | ---: | ---: |", flush=True)
    for label in ("default", "mode"):
        torch._dynamo.reset()  # a fresh compile per kernels mode; B = 32 recompiles for its own shapes
        for batch in (1, 32):
            try:
                with torch.no_grad(), (batch_invariant(model=model, traceable=traceable) if label == "mode"
                                       else torch.no_grad()):
                    warm, ms = step_ms(model, batch, args.tokens)
                roof = ms / (weight_bytes / bandwidth * 1e3)
                print(f"| {label} | {batch} | {warm:.1f} | {ms:.2f} | {roof:.1f} |", flush=True)
            except Exception as exc:  # noqa: BLE001 - record the failure, go on
                print(f"| {label} | {batch} | FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:120]} | | |",
                      flush=True)
    torch._dynamo.reset()
    try:
        print(bits(model), flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"bits check FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    main()
