"""Reproduce the illegal memory access of `nondet kernels bench` (issue 11, section 4).

Usage on the device machine: python3 scripts/gpu_repro_iam.py race|garbage|synced|side-stream [old]

- race:    the decode section as the bench ran it, after other work left non-zero bytes in the
           caching allocator: inputs are made on the default stream and timed at once by
           do_bench_cudagraph, whose warm-up runs on a fresh side stream that does not wait.
- garbage [old]: the decode kernel given a negative kv_start on purpose (what the race hands
           it when torch.zeros has not run yet); run it under compute-sanitizer.
- synced:  the race case with the stream synchronized before timing (the fix in bench._bench).
- side-stream [old]: the race made certain (a busy default stream, a recycled block holding a
           negative int), against this tree's kernel or the pre-fix copy in .old/ (no clamp).

`old` needs the pre-fix kernel: `mkdir -p .old && git show cf9d845~1:nondet/kernels/triton_attention.py
> .old/triton_attention_head.py` (.old/ is ignored: name it in the device call's carry).
"""

import sys

import torch
import triton.testing

from nondet.kernels import triton_attention


def dirty_allocator() -> None:
    # what the matmul/rmsnorm sections leave behind: freed blocks full of random bits
    # (large and small pools alike: kv_start is a small block)
    junk = [torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device="cuda")
            for n in [1 << 28] + [64] * 2048]
    torch.cuda.synchronize()
    del junk


def decode_like_bench(sync: bool) -> None:
    for b, s in ((1, 1024), (8, 4096), (32, 4096), (1, 32768)):
        q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, 8, s, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        start = torch.zeros(b, dtype=torch.int32, device="cuda")
        if sync:
            torch.cuda.synchronize()
        t = triton.testing.do_bench_cudagraph(lambda: triton_attention.attention(q, k, v, None, None, start),
                                              rep=20, return_mode="median")
        print(f"B={b} KV={s}: {t * 1e3:.1f} us", flush=True)
        del k, v


def unsynced_side_stream(attention) -> None:
    """The race made certain: the default stream is busy when kv_start's zeros are queued behind
    it, and a side stream that does not wait launches the kernel (as do_bench_cudagraph's
    warm-up does). kv_start then holds what the recycled block held: here a negative int."""
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
    junk = torch.full((128,), -(1 << 30), dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    del junk  # nothing is allocated between this and kv_start: it gets junk's block
    torch.cuda._sleep(200_000_000)  # ~0.1 s of busy default stream
    start = torch.zeros(1, dtype=torch.int32, device="cuda")  # same block as junk: memset queued
    with torch.cuda.stream(torch.cuda.Stream()):
        attention(q, k, k, None, None, start)
    torch.cuda.synchronize()


def _old():
    import importlib.util

    spec = importlib.util.spec_from_file_location("old_attention", ".old/triton_attention_head.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    mode = sys.argv[1]
    if mode == "side-stream":  # python3 scripts/gpu_repro_iam.py side-stream [old]
        if sys.argv[2:] == ["old"]:
            unsynced_side_stream(_old().attention)
        else:
            unsynced_side_stream(triton_attention.attention)
        print("side-stream ok")
        return
    dirty_allocator()
    if mode == "garbage":  # [old]: HEAD's kernel copy in .old/, without the clamp
        attention = _old().attention if sys.argv[2:] == ["old"] else triton_attention.attention
        q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
        start = torch.tensor([-(1 << 30)], dtype=torch.int32, device="cuda")
        out = attention(q, k, k, None, None, start)
        torch.cuda.synchronize()
        print("garbage kv_start: finished, output all zero:", bool((out == 0).all()))
    else:
        decode_like_bench(sync=mode == "synced")
    torch.cuda.synchronize()
    print(mode, "ok")


if __name__ == "__main__":
    main()
