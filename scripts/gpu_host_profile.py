"""Where the mode's host time goes on an 8B-shaped Qwen3 (hidden 4096, 32 / 8 heads, bf16), eager.

    python3 scripts/gpu_host_profile.py [--layers 36] [--tokens 512] [--parts ops,breakdown,launch,prefill]

Parts (--parts, all by default):
- ops: host microseconds per call of the ops a layer's prefill runs, ours against torch's, the GPU
  kept busy by a sleep kernel so the calls only enqueue;
- breakdown: one invariant linear piece by piece, and host vs in-kernel TMA descriptors (host and
  GPU time, same bits);
- launch: the TMA matmul's launch alone: Triton's JIT call against its compiled kernel called
  directly (`CompiledKernel[grid]`), and the scratch scope around it;
- prefill-diff: cProfile of the eager prefill under default kernels and under the mode, the functions
  whose own time (tottime) grew most;
- prefill: the eager prefill of `--tokens` tokens (transformers runs generate's prefill eager, also
  on the compiled path): wall ms, default vs the mode (and the mode with host TMA descriptors), and
  cProfile of the mode's forward.
"""

import argparse
import io
import time

import torch

from gpu_compile import build, prefill_ms
from gpu_compiled_host import profiled


def host_us(fn, calls: int = 50) -> float:
    """Host time of one `fn()` while the GPU is busy (a sleep kernel queued first), microseconds."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # ~1 s of GPU time ahead of the calls: they only enqueue
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - started) / calls * 1e6
    torch.cuda.synchronize()
    return host


def print_op_costs(tokens: int) -> None:
    from nondet.kernels import batch_invariant, ops

    g = torch.Generator("cuda").manual_seed(0)
    x = torch.randn(tokens, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    wkv = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    q = torch.randn(1, 32, tokens, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 8, tokens, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    rows = {
        "linear 4096->4096": (lambda: torch.nn.functional.linear(x, w), lambda: ops.linear(x, w)),
        "linear 4096->1024": (lambda: torch.nn.functional.linear(x, wkv), lambda: ops.linear(x, wkv)),
        "mean over 4096": (lambda: x.float().pow(2).mean(-1, keepdim=True), None),
        "attention causal": (lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(4, 1), k.repeat_interleave(4, 1), is_causal=True), lambda: ops.attention(q, k, k)),
    }
    print(f"| op ({tokens} rows) | torch host us | the mode (aten override) host us | nondet.ops direct host us |")
    print("| --- | ---: | ---: | ---: |")
    for name, (torch_fn, direct) in rows.items():
        default = host_us(torch_fn)
        with batch_invariant():
            mode = host_us(torch_fn)
        ours = host_us(direct) if direct is not None else float("nan")
        print(f"| {name} | {default:.1f} | {mode:.1f} | {ours:.1f} |", flush=True)


def print_matmul_breakdown(tokens: int) -> None:
    """The host cost of one invariant linear (tokens x 4096 @ 4096 x 4096), piece by piece."""
    import triton
    import triton.testing

    from nondet.kernels import triton_matmul as tm
    from nondet.kernels.config import matmul_config

    @triton.jit
    def _noop(x_ptr, n):
        pass

    g = torch.Generator("cuda").manual_seed(0)
    a = torch.randn(tokens, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    b = w.t()
    cfg = matmul_config(a.dtype, tokens, 4096, 4096, a.device)
    pieces = {
        "an empty Triton kernel, 2 args": lambda: _noop[(1,)](a, 1),
        "torch.empty (M, N)": lambda: torch.empty(tokens, 4096, device="cuda", dtype=torch.bfloat16),
        "matmul_config": lambda: matmul_config(a.dtype, tokens, 4096, 4096, a.device),
        "_tma_ok": lambda: tm._tma_ok(a, b),
        "2 host TMA descriptors": lambda: tm._host_descs(a, b, cfg),
    }
    print(f"| piece of an invariant linear ({tokens} x 4096 @ 4096 x 4096) | host us |")
    print("| --- | ---: |")
    for name, fn in pieces.items():
        print(f"| {name} | {host_us(fn):.1f} |", flush=True)
    print("| path (eager) | host us | GPU us, 512 x 4096 @ 4096 x 4096 | GPU us, 4096 x 4096 @ 4096 x 14336 |")
    print("| --- | ---: | ---: | ---: |")
    big_a, big_w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16), \
        torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16)
    outs = []
    try:
        for device_desc in (False, True):
            tm.EAGER_DEVICE_DESC = device_desc
            us = host_us(lambda: tm.mm(a, b))
            gpu = triton.testing.do_bench(lambda: tm.mm(a, b), warmup=20, rep=100) * 1e3
            gpu_big = triton.testing.do_bench(lambda: tm.mm(big_a, big_w.t()), warmup=5, rep=50) * 1e3
            outs.append(tm.mm(a, b))
            print(f"| {'descriptors in the kernel' if device_desc else 'host descriptors'} | {us:.1f} | {gpu:.1f} | "
                  f"{gpu_big:.1f} |", flush=True)
    finally:
        tm.EAGER_DEVICE_DESC = True
    print(f"both give the same bits: {torch.equal(outs[0], outs[1])}", flush=True)


def print_launch_costs(tokens: int) -> None:
    """Host us of the TMA matmul's launch through Triton's JIT (binding, specialization, cache key)
    against calling the compiled kernel it returned, same arguments (tokens x 4096 @ 4096 x 4096)."""
    import inspect

    import triton

    from nondet.kernels import triton_matmul as tm
    from nondet.kernels.config import k_chunk_for, matmul_config, sm_count
    from nondet.kernels.launch import triton_scratch

    g = torch.Generator("cuda").manual_seed(0)
    a = torch.randn(tokens, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    c = torch.empty(tokens, 4096, device="cuda", dtype=torch.bfloat16)
    cfg = matmul_config(a.dtype, tokens, 4096, 4096, a.device)
    m, n, k = tokens, 4096, 4096
    programs = min(sm_count(a.device), triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n))
    args = dict(a_src=a, b_src=w, c_ptr=c, bias_ptr=c, M=m, N=n, K=k, s_cm=c.stride(0), s_cn=c.stride(1),
                s_biasm=c.stride(0), s_biasn=c.stride(1), alpha=1.0, beta=1.0, BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, K_CHUNK=k_chunk_for(k, cfg), GROUP_M=cfg.group_m,
                NUM_PROGRAMS=programs, HAS_BIAS=False, UNIT_SCALE=True, UPCAST=False, DEVICE_DESC=True)
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    with triton_scratch():
        compiled = tm._mm_tma_kernel[(programs,)](**args, **options)
    ordered = [args[name] for name in tm._mm_tma_kernel.arg_names]

    def jit_call():
        with triton_scratch():
            tm._mm_tma_kernel[(programs,)](**args, **options)

    def direct_call():
        with triton_scratch():
            compiled[(programs, 1, 1)](*ordered)

    def scope():
        with triton_scratch():
            pass

    def unbound_mm():
        tm.BIND_EAGER_LAUNCHES = False
        try:
            tm.mm(a, w.t())
        finally:
            tm.BIND_EAGER_LAUNCHES = True

    reference = tm.mm(a, w.t())
    rows = {"Triton JIT call (kernel[grid](...))": jit_call, "compiled kernel called directly": direct_call,
            "triton_scratch scope alone": scope, "triton_matmul._mm_tma": lambda: tm._mm_tma(a, w.t(), c, None, 1.0, 1.0, cfg),
            "triton_matmul.mm (bound after its first call)": lambda: tm.mm(a, w.t()),
            "triton_matmul.mm, every call through the JIT": unbound_mm}
    print(f"| TMA matmul launch ({tokens} x 4096 @ 4096 x 4096) | host us |")
    print("| --- | ---: |")
    for name, fn in rows.items():
        print(f"| {name} | {host_us(fn):.1f} |", flush=True)
    c.zero_()
    direct_call()
    print(f"direct call gives mm's bits: {torch.equal(c, reference)}", flush=True)
    print(f"triton {triton.__version__}; CompiledKernel.__getitem__ source:", flush=True)
    print(inspect.getsource(type(compiled).__getitem__), flush=True)
    print(inspect.getsource(type(tm._mm_tma_kernel).run), flush=True)


def print_prefill_diff(model, tokens: int, top: int = 30) -> None:
    """The eager prefill's functions whose own time (ms) grew most under the mode, with call counts."""
    from nondet.kernels import batch_invariant

    ids = torch.randint(3, 32000, (1, tokens), device="cuda")
    forward = lambda: model(ids, use_cache=False)  # noqa: E731
    with torch.no_grad():
        forward()  # warm-ups: Triton's compiles stay out of the profiles
        default = profiled(forward).stats
        with batch_invariant(model=model):
            forward()
            mode = profiled(forward).stats
    rows = []
    for key in set(default) | set(mode):
        d_calls, d_own = (default[key][1], default[key][2]) if key in default else (0, 0.0)
        m_calls, m_own = (mode[key][1], mode[key][2]) if key in mode else (0, 0.0)
        rows.append((m_own - d_own, key, d_calls, d_own, m_calls, m_own))
    rows.sort(key=lambda row: -row[0])
    total_default = sum(v[2] for v in default.values()) * 1e3
    total_mode = sum(v[2] for v in mode.values()) * 1e3
    print(f"eager prefill {tokens} tokens under cProfile: default {total_default:.1f} ms, mode {total_mode:.1f} ms")
    print("| function | default calls | default own ms | mode calls | mode own ms | grew ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for grew, (path, line, name), d_calls, d_own, m_calls, m_own in rows[:top]:
        where = f"{path.rsplit('/', 2)[-1]}:{line} {name}" if line else name
        print(f"| {where} | {d_calls} | {d_own * 1e3:.2f} | {m_calls} | {m_own * 1e3:.2f} | {grew * 1e3:.2f} |",
              flush=True)


def print_prefill_profile(model, tokens: int, top: int = 25) -> None:
    from nondet.kernels import batch_invariant, triton_matmul

    with torch.no_grad():
        default = prefill_ms(model, tokens)
        with batch_invariant(model=model):
            try:
                triton_matmul.EAGER_DEVICE_DESC = False
                before = prefill_ms(model, tokens)
            finally:
                triton_matmul.EAGER_DEVICE_DESC = True
            try:
                triton_matmul.BIND_EAGER_LAUNCHES = False
                unbound = prefill_ms(model, tokens)
            finally:
                triton_matmul.BIND_EAGER_LAUNCHES = True
            mode = prefill_ms(model, tokens)
            ids = torch.randint(3, 32000, (1, tokens), device="cuda")
            stats = profiled(lambda: model(ids, use_cache=False))
    print(f"eager prefill {tokens} tokens: default {default:.2f} ms, mode {mode:.2f} ms ({default / mode:.2f}x); "
          f"with host TMA descriptors {before:.2f} ms ({default / before:.2f}x); every matmul through Triton's JIT "
          f"(no bound launches) {unbound:.2f} ms ({default / unbound:.2f}x)", flush=True)
    for key in ("tottime", "cumtime"):
        text = io.StringIO()
        stats.stream = text
        stats.sort_stats(key).print_stats(top)
        print(f"-- the mode's prefill by {key}:\n" + "\n".join(text.getvalue().splitlines()[4:4 + top + 4]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--parts", default="ops,breakdown,launch,prefill", help="which of ops, breakdown, launch, prefill-diff, prefill to run")
    args = parser.parse_args()
    parts = args.parts.split(",")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          flush=True)
    if "ops" in parts:
        print_op_costs(args.tokens)
    if "breakdown" in parts:
        print_matmul_breakdown(args.tokens)
    if "launch" in parts:
        print_launch_costs(args.tokens)
    if "prefill-diff" in parts:
        print_prefill_diff(build(args.layers), args.tokens)
    if "prefill" in parts:
        print_prefill_profile(build(args.layers), args.tokens)


if __name__ == "__main__":
    main()
