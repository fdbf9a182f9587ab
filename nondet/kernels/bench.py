"""`nondet kernels bench`: our kernels against the defaults (cuBLAS, torch, SDPA) on one GPU.

Kernel times are medians from triton.testing.do_bench_cudagraph (CUDA graph replay timed with
CUDA events, so launch overhead is excluded for both sides). End to
end, the GPU time of one decode step and one prefill of a Qwen3-8B-shaped random model is the
sum of kernel times from the profiler, so Python launch overhead (HF eager is launch-bound)
does not hide what the kernels cost. `ratio` is throughput relative to the default:
default time / our time (1.0 = as fast, < 1 slower).

Every section also checks, in the same run, that our kernel is bitwise batch-invariant on the
shapes it times (a row computed alone has the raw bits it has inside the largest batch). The
score (`--score`) is the geometric mean over the four groups of each group's geometric-mean
ratio on the fixed SCORE set below, and 0 if any invariance check of the run failed.
"""

import datetime
import math
import platform
from dataclasses import dataclass, field

MATMUL_M = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
MATMUL_KN = ((4096, 4096), (4096, 14336), (14336, 4096))
RMS_ROWS = (1, 16, 256, 4096, 16384, 65536)
DECODE_BATCH = (1, 8, 32, 64)
DECODE_KV = (1024, 4096, 16384, 32768)
E2E_BATCH = (1, 16, 64)

# The score's fixed shape set (docs/benchmarks.md lists it). Matmul invariance is checked at
# every M below (bucket edges included) against the rows of the largest M.
SCORE_MATMUL_M = (1, 16, 64, 128, 512, 2048, 8192)
INVARIANCE_M = (1, 2, 7, 15, 16, 17, 63, 64, 65, 127, 128, 129, 511, 512, 513, 1023, 1024, 1025,
                2047, 2048, 4097, 8192)
SCORE_RMS_ROWS = (1, 256, 16384)
SCORE_DECODE = ((1, 1024), (1, 8192), (1, 32768), (8, 4096), (32, 4096), (64, 4096))


@dataclass
class Row:
    group: str  # "matmul", "rmsnorm", "decode attention", "end to end"
    shape: str
    ours_us: float
    default_us: float
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.default_us / self.ours_us if self.ours_us else float("nan")


@dataclass
class Check:
    group: str  # the Row group whose kernel was checked
    what: str  # which rows were compared with which
    ok: bool  # raw bits equal everywhere
    detail: str = ""  # where they differed first, when they did


@dataclass
class Report:
    device: str
    date: str
    command: str
    software: str
    rows: list[Row] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def same_bits(a, b) -> bool:
    """Raw bits equal (so -0.0 differs from +0.0 and NaN payloads count), not just ==."""
    import torch

    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(width), b.view(width))


def score(report: Report) -> float:
    """Geometric mean over groups of each group's geometric-mean ratio; 0 if a check failed."""
    if not report.checks or not all(c.ok for c in report.checks):
        return 0.0
    groups = {r.group for r in report.rows}
    means = [_geomean([r.ratio for r in report.rows if r.group == g]) for g in sorted(groups)]
    return _geomean(means) if means else 0.0


def score_line(report: Report, quick: bool = False) -> str:
    """The last line of `nondet kernels bench --score`: `score=X`, and why when X is 0."""
    failed = [f"{c.group} {c.what.split(':')[0]}" for c in report.checks if not c.ok]
    line = f"score={score(report):.3f}"
    if failed:
        line += " (not bitwise batch-invariant: " + "; ".join(failed) + ")"
    return line + (" (quick set: not comparable with the full score)" if quick else "")


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _bench(fn) -> float:
    """Median GPU time of fn() in microseconds, replayed from a CUDA graph.

    Graph replay removes Python and launch overhead, which would otherwise dominate small
    shapes for both sides (Triton's Python launcher costs more than cuBLAS's).
    """
    import torch
    import triton.testing

    # do_bench_cudagraph runs fn on a fresh side stream that does not wait for the default
    # stream. Without this, fn can read inputs whose torch.randn / torch.zeros have not run yet:
    # in one process, recycled blocks then hand the decode kernel a garbage kv_start, which
    # addressed outside K/V (an illegal memory access).
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3


def bench_matmul(report: Report, ms=MATMUL_M, kns=MATMUL_KN, check_ms=INVARIANCE_M) -> None:
    import torch

    from nondet.kernels import triton_matmul

    for k, n in kns:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        wt = w.t()
        x_all = torch.randn(max(*ms, *check_ms), k, device="cuda", dtype=torch.bfloat16)
        _check_rows(report, "matmul", f"K={k} N={n}", lambda x: triton_matmul.mm(x, wt), x_all,
                    sorted(set(ms) | set(check_ms)))
        for m in ms:
            x = x_all[:m]
            ours = _bench(lambda: triton_matmul.mm(x, wt))
            ref = _bench(lambda: torch.mm(x, wt))
            tflops = 2 * m * n * k / ours / 1e6
            report.rows.append(Row("matmul", f"M={m} K={k} N={n}", ours, ref, f"{tflops:.0f} TFLOP/s"))


def _check_rows(report: Report, group: str, name: str, fn, x_all, counts) -> None:
    """fn(x_all[:m]) must be the first m rows of fn(x_all), bitwise, for every m in counts."""
    full = fn(x_all)
    bad = [m for m in counts if not same_bits(fn(x_all[:m]), full[:m])]
    report.checks.append(Check(group, f"{name}: first m rows at m = {', '.join(map(str, counts))} "
                                      f"vs m = {x_all.shape[0]}", not bad,
                               f"differs at m = {', '.join(map(str, bad))}" if bad else ""))


def measured_bandwidth() -> float:
    """Device-to-device copy bandwidth, bytes read + written per second."""
    import torch

    # 1 GiB of float32 (a uint8 copy measured only 2.7 TB/s on an H200, below what RMSNorm reached)
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / (_bench(lambda: dst.copy_(src)) * 1e-6)


def bench_rmsnorm(report: Report, rows=RMS_ROWS, hidden: int = 4096) -> None:
    import torch
    import torch.nn.functional as F

    from nondet.kernels import triton_rows

    bw = measured_bandwidth()
    report.notes.append(f"measured copy bandwidth {bw / 1e12:.2f} TB/s (read + write)")
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    x_all = torch.randn(max(rows), hidden, device="cuda", dtype=torch.bfloat16)
    _check_rows(report, "rmsnorm", f"rows x {hidden}", lambda x: triton_rows.rms_norm(x, w, 1e-6), x_all,
                sorted({*rows, 2, 17, 1000}))
    for r in rows:
        x = x_all[:r]
        ours = _bench(lambda: triton_rows.rms_norm(x, w, 1e-6))
        ref = _bench(lambda: F.rms_norm(x, (hidden,), w, 1e-6))
        moved = 2 * x.numel() * x.element_size() + w.numel() * 2
        rate = moved / (ours * 1e-6)
        report.rows.append(Row("rmsnorm", f"rows={r} x {hidden}", ours, ref,
                               f"{rate / 1e12:.2f} TB/s = {100 * rate / bw:.0f}% of copy BW"))


def bench_decode(report: Report, shapes=None, heads=32, kv_heads=8, dim=128) -> None:
    import torch
    import torch.nn.functional as F

    from nondet.kernels import triton_attention

    shapes = shapes or [(b, s) for b in DECODE_BATCH for s in DECODE_KV if b * s <= 32 * 32768]
    for b, s in shapes:  # at most 1M cached tokens: 2 x 2 GiB of K/V per layer
        q = torch.randn(b, heads, 1, dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, kv_heads, s, dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        start = torch.zeros(b, dtype=torch.int32, device="cuda")
        full = triton_attention.attention(q, k, v, None, None, start)
        alone = triton_attention.attention(q[-1:], k[-1:], v[-1:], None, None, start[-1:])
        report.checks.append(Check("decode attention", f"B={b} KV={s}: last row alone vs in the batch",
                                   same_bits(alone[0], full[-1])))
        ours = _bench(lambda: triton_attention.attention(q, k, v, None, None, start))
        ref = _bench(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        gbs = 2 * k.numel() * 2 / (ours * 1e-6) / 1e9
        report.rows.append(Row("decode attention", f"B={b} KV={s} H={heads}/{kv_heads} D={dim}",
                               ours, ref, f"{gbs:.0f} GB/s"))
        del k, v


def _kernel_time_us(fn) -> float:
    """Sum of GPU kernel times of one fn() call, from the profiler."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == DeviceType.CUDA)


def qwen3_8b_like(layers: int = 36):
    """A random Qwen3-8B-shaped model on the GPU, bf16 (nothing downloaded)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    model.set_attn_implementation("sdpa")
    return model.eval()


def bench_end_to_end(report: Report, batches=E2E_BATCH, prompt: int = 512, layers: int = 36) -> None:
    import torch
    from transformers import DynamicCache

    from nondet.kernels import batch_invariant
    from nondet.kernels.hf_names import cache_kwarg, output_cache

    model = qwen3_8b_like(layers)
    cache_arg = cache_kwarg(model)
    ids_all = torch.randint(0, 151936, (max(batches), prompt), device="cuda")  # row 0 is every batch's row 0
    step_all = torch.randint(0, 151936, (max(batches), 1), device="cuda")
    row0 = {}  # phase -> {batch: row 0's logits under the mode}
    for b in batches:
        ids, step = ids_all[:b], step_all[:b]
        times = {}
        for mode in (False, True):
            def prefill():
                with torch.no_grad():
                    return model(ids, logits_to_keep=1, **{cache_arg: DynamicCache()})

            def run(fn):
                if not mode:
                    return fn()
                with batch_invariant(model=model):
                    return fn()

            first = run(prefill)
            cache = output_cache(first)

            def decode():
                with torch.no_grad():
                    cache.crop(prompt)
                    return model(step, logits_to_keep=1, **{cache_arg: cache})

            if mode:
                row0.setdefault("prefill", {})[b] = first.logits[0].clone()
                row0.setdefault("decode", {})[b] = run(decode).logits[0].clone()
            times[mode, "prefill"] = run(lambda: _kernel_time_us(prefill))
            times[mode, "decode"] = run(lambda: _kernel_time_us(decode))
            del cache, first
            torch.cuda.empty_cache()
        for phase in ("prefill", "decode"):
            shape = f"{phase} B={b}" + (f" x {prompt} tokens" if phase == "prefill" else f" at KV {prompt}")
            report.rows.append(Row("end to end", shape, times[True, phase], times[False, phase],
                                   "GPU kernel time, profiler sum"))
    for phase, by_batch in row0.items():
        base = by_batch[batches[0]]
        bad = [b for b, logits in by_batch.items() if not same_bits(logits, base)]
        report.checks.append(Check("end to end", f"{phase}: row 0's logits under the mode at B = "
                                   f"{', '.join(map(str, batches))}", not bad,
                                   f"differs at B = {', '.join(map(str, bad))}" if bad else ""))
    report.notes.append(f"end to end: random Qwen3-8B-shaped model (hidden 4096, {layers} layers, "
                        "32/8 heads, vocab 151936, bf16); default = HF sdpa + cuBLAS")


def run(command: str, quick: bool = False, sections=("matmul", "rmsnorm", "decode", "e2e"),
        progress=None, score_set: bool = False) -> Report:
    """Run the benchmark sections on the current CUDA device; progress(report) after each one.

    score_set: time the fixed SCORE shape set (what `--score` reports) instead of the full tables.
    """
    import torch
    import transformers
    import triton

    report = Report(
        device=torch.cuda.get_device_name(),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command=command,
        software=f"torch {torch.__version__}, triton {triton.__version__}, "
                 f"transformers {transformers.__version__}, python {platform.python_version()}")
    if quick:
        shapes = dict(ms=(1, 64, 512, 4096), rows=(1, 256, 16384), decode=((1, 1024), (8, 8192)), layers=4)
    elif score_set:
        shapes = dict(ms=SCORE_MATMUL_M, rows=SCORE_RMS_ROWS, decode=SCORE_DECODE, layers=36)
    else:
        shapes = dict(ms=MATMUL_M, rows=RMS_ROWS, decode=None, layers=36)
    steps = {
        "matmul": lambda: bench_matmul(report, ms=shapes["ms"]),
        "rmsnorm": lambda: bench_rmsnorm(report, rows=shapes["rows"]),
        "decode": lambda: bench_decode(report, shapes=shapes["decode"]),
        "e2e": lambda: bench_end_to_end(report, layers=shapes["layers"]),
    }
    for name, step in steps.items():
        if name in sections:
            step()
            if progress is not None:
                progress(report)
    return report


TARGETS = {
    "matmul": "throughput >= 0.9x cuBLAS at M >= 128, >= 0.7x at M <= 64",
    "rmsnorm": ">= 80% of measured HBM bandwidth; default = F.rms_norm",
    "decode attention": "time within 1.3x of torch SDPA (ratio >= 0.77)",
    "end to end": "GPU time >= 0.8x of default throughput (ratio >= 0.8)",
}


def to_markdown(report: Report) -> str:
    lines = ["# Benchmarks: batch-invariant kernels vs defaults", "",
             f"- device: {report.device}", f"- date: {report.date}", f"- command: `{report.command}`",
             f"- software: {report.software}",
             "- ratio = default time / our time (throughput relative to the default; 1.0 = as fast)"]
    lines += [f"- {note}" for note in report.notes]
    if report.checks:
        passed = sum(c.ok for c in report.checks)
        lines += ["", "## batch invariance (checked in this run)", "",
                  f"{passed} of {len(report.checks)} checks bitwise equal.", "",
                  "| kernel | compared | bitwise equal |", "|---|---|---|"]
        lines += [f"| {c.group} | {c.what} | {'yes' if c.ok else 'NO: ' + c.detail} |" for c in report.checks]
    for group in dict.fromkeys(r.group for r in report.rows):
        lines += ["", f"## {group}", "", f"Target: {TARGETS.get(group, '')}", "",
                  "| shape | ours (us) | default (us) | ratio | note |", "|---|---:|---:|---:|---|"]
        for r in (r for r in report.rows if r.group == group):
            lines.append(f"| {r.shape} | {r.ours_us:.1f} | {r.default_us:.1f} | {r.ratio:.2f} | {r.note} |")
    return "\n".join(lines) + "\n"


def sweep_matmul(ms=(1, 16, 64, 128, 512, 2048, 8192), kns=MATMUL_KN) -> None:
    """Developer aid: time candidate bf16 configurations against cuBLAS (prints a table)."""
    import torch

    from nondet.kernels import triton_matmul
    from nondet.kernels.config import MatmulConfig

    candidates = {
        "128x128x64 c1024 w8 s4": MatmulConfig(128, 128, 64, 1024, 8, 8, 4),
        "128x128x64 c1024 w8 s3": MatmulConfig(128, 128, 64, 1024, 8, 8, 3),
        "128x128x64 c2048 w8 s4": MatmulConfig(128, 128, 64, 2048, 8, 8, 4),
        "128x256x64 c1024 w8 s3": MatmulConfig(128, 256, 64, 1024, 8, 8, 3),
        "128x256x64 c2048 w8 s3": MatmulConfig(128, 256, 64, 2048, 8, 8, 3),
        "128x128x64 nochunk w8 s4": MatmulConfig(128, 128, 64, 1 << 20, 8, 8, 4),
        "128x256x64 nochunk w8 s3": MatmulConfig(128, 256, 64, 1 << 20, 8, 8, 3),
    }
    print("shape | cuBLAS us | " + " | ".join(candidates))
    for k, n in kns:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = _bench(lambda: torch.mm(x, w))
            cells = []
            for cfg in candidates.values():
                try:
                    t = _bench(lambda: triton_matmul.mm(x, w, cfg=cfg))
                    cells.append(f"{t:.1f} ({ref / t:.2f}x)")
                except Exception as exc:  # noqa: BLE001 - a sweep reports, never stops
                    cells.append(f"error {type(exc).__name__}")
            print(f"M={m} K={k} N={n} | {ref:.1f} | " + " | ".join(cells), flush=True)


def sweep_attention(cases=((1, 4096), (32, 4096), (8, 32768), (64, 16384)), heads=32, kv_heads=8, dim=128) -> None:
    """Developer aid: time candidate bf16 attention configurations on decode against SDPA."""
    import torch
    import torch.nn.functional as F

    from nondet.kernels import triton_attention
    from nondet.kernels.config import AttentionConfig

    candidates = {
        "m64 n64 c256 w4 s2": AttentionConfig(64, 64, 256, 4, 2),
        "m16 n64 c256 w4 s3": AttentionConfig(16, 64, 256, 4, 3),
        "m16 n128 c256 w4 s2": AttentionConfig(16, 128, 256, 4, 2),
        "m64 n128 c256 w8 s2": AttentionConfig(64, 128, 256, 8, 2),
        "m64 n64 c512 w4 s2": AttentionConfig(64, 64, 512, 4, 2),
    }
    print("decode | SDPA us | " + " | ".join(candidates))
    for b, s in cases:
        q = torch.randn(b, heads, 1, dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, kv_heads, s, dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        start = torch.zeros(b, dtype=torch.int32, device="cuda")
        ref = _bench(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        cells = []
        for cfg in candidates.values():
            try:
                t = _bench(lambda: triton_attention.attention(q, k, v, None, None, start, cfg=cfg))
                cells.append(f"{t:.1f} ({ref / t:.2f}x)")
            except Exception as exc:  # noqa: BLE001 - a sweep reports, never stops
                cells.append(f"error {type(exc).__name__}")
        print(f"B={b} KV={s} | {ref:.1f} | " + " | ".join(cells), flush=True)
