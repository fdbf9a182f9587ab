"""`nondet kernels bench`: our kernels against the defaults (cuBLAS, torch, SDPA) on one GPU.

Kernel times are medians from triton.testing.do_bench_cudagraph (CUDA graph replay timed with
CUDA events, so launch overhead is excluded for both sides). End to
end, the GPU time of one decode step and one prefill of a Qwen3-8B-shaped random model is the
sum of kernel times from the profiler, so Python launch overhead (HF eager is launch-bound)
does not hide what the kernels cost. `ratio` is throughput relative to the default:
default time / our time (1.0 = as fast, < 1 slower).
"""

import datetime
import platform
from dataclasses import dataclass, field

MATMUL_M = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
MATMUL_KN = ((4096, 4096), (4096, 14336), (14336, 4096))
RMS_ROWS = (1, 16, 256, 4096, 16384, 65536)
DECODE_BATCH = (1, 8, 32, 64)
DECODE_KV = (1024, 4096, 16384, 32768)
E2E_BATCH = (1, 16, 64)


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
class Report:
    device: str
    date: str
    command: str
    software: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _bench(fn) -> float:
    """Median GPU time of fn() in microseconds, replayed from a CUDA graph.

    Graph replay removes Python and launch overhead, which would otherwise dominate small
    shapes for both sides (Triton's Python launcher costs more than cuBLAS's).
    """
    import triton.testing

    return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3


def bench_matmul(report: Report, ms=MATMUL_M, kns=MATMUL_KN) -> None:
    import torch

    from nondet.kernels import triton_matmul

    for k, n in kns:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            wt = w.t()
            ours = _bench(lambda: triton_matmul.mm(x, wt))
            ref = _bench(lambda: torch.mm(x, wt))
            tflops = 2 * m * n * k / ours / 1e6
            report.rows.append(Row("matmul", f"M={m} K={k} N={n}", ours, ref, f"{tflops:.0f} TFLOP/s"))


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
    for r in rows:
        x = torch.randn(r, hidden, device="cuda", dtype=torch.bfloat16)
        ours = _bench(lambda: triton_rows.rms_norm(x, w, 1e-6))
        ref = _bench(lambda: F.rms_norm(x, (hidden,), w, 1e-6))
        moved = 2 * x.numel() * x.element_size() + w.numel() * 2
        rate = moved / (ours * 1e-6)
        report.rows.append(Row("rmsnorm", f"rows={r} x {hidden}", ours, ref,
                               f"{rate / 1e12:.2f} TB/s = {100 * rate / bw:.0f}% of copy BW"))


def bench_decode(report: Report, batches=DECODE_BATCH, kvs=DECODE_KV, heads=32, kv_heads=8, dim=128) -> None:
    import torch
    import torch.nn.functional as F

    from nondet.kernels import triton_attention

    for b in batches:
        for s in kvs:
            if b * s > 32 * 32768:  # at most 1M cached tokens: 2 x 2 GiB of K/V per layer
                continue
            q = torch.randn(b, heads, 1, dim, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, kv_heads, s, dim, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            start = torch.zeros(b, dtype=torch.int32, device="cuda")
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

    model = qwen3_8b_like(layers)
    for b in batches:
        ids = torch.randint(0, 151936, (b, prompt), device="cuda")
        step = torch.randint(0, 151936, (b, 1), device="cuda")
        times = {}
        for mode in (False, True):
            def prefill():
                with torch.no_grad():
                    return model(ids, past_key_values=DynamicCache(), logits_to_keep=1)

            def run(fn):
                if not mode:
                    return fn()
                with batch_invariant(model=model):
                    return fn()

            cache = run(prefill).past_key_values

            def decode():
                with torch.no_grad():
                    cache.crop(prompt)
                    return model(step, past_key_values=cache, logits_to_keep=1)

            times[mode, "prefill"] = run(lambda: _kernel_time_us(prefill))
            times[mode, "decode"] = run(lambda: _kernel_time_us(decode))
            del cache
            torch.cuda.empty_cache()
        for phase in ("prefill", "decode"):
            shape = f"{phase} B={b}" + (f" x {prompt} tokens" if phase == "prefill" else f" at KV {prompt}")
            report.rows.append(Row("end to end", shape, times[True, phase], times[False, phase],
                                   "GPU kernel time, profiler sum"))
    report.notes.append(f"end to end: random Qwen3-8B-shaped model (hidden 4096, {layers} layers, "
                        "32/8 heads, vocab 151936, bf16); default = HF sdpa + cuBLAS")


def run(command: str, quick: bool = False, sections=("matmul", "rmsnorm", "decode", "e2e"),
        progress=None) -> Report:
    """Run the benchmark sections on the current CUDA device; progress(report) after each one."""
    import torch
    import transformers
    import triton

    report = Report(
        device=torch.cuda.get_device_name(),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command=command,
        software=f"torch {torch.__version__}, triton {triton.__version__}, "
                 f"transformers {transformers.__version__}, python {platform.python_version()}")
    steps = {
        "matmul": lambda: bench_matmul(report, ms=(1, 64, 512, 4096) if quick else MATMUL_M),
        "rmsnorm": lambda: bench_rmsnorm(report),
        "decode": lambda: bench_decode(report, kvs=(1024, 8192) if quick else DECODE_KV),
        "e2e": lambda: bench_end_to_end(report, layers=4 if quick else 36),
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
