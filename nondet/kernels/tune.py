"""`nondet kernels tune`: per (dtype, K, N), pick each M bucket's fastest configuration among those
that give the shipped dispatch's bits.

Only tiles, warps, stages and the TMA flag move: every candidate keeps block_k and k_chunk, the K
order (config.py). A candidate is kept for a bucket only if, at the bucket's smallest and largest
M (where it is also timed), every row equals in raw bits the row the shipped dispatch gives at M = 8192 (so mixing tuned and
shipped buckets, or tuned and untuned runs, cannot change a row), and its error against torch
in fp32 is that of a bf16 matmul. The bucket edges stay the shipped ones; no choice depends on
anything but (dtype, K, N) and the bucket. A candidate must beat the shipped one by MARGIN.
"""

import datetime
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from nondet.kernels.config import MATMUL_BUCKETS, MatmulConfig, clear_tuning_cache, shipped_buckets, tuning_key

MARGIN = 0.97  # a candidate's time must be below 97% of the shipped one's (run-to-run noise is ~3%)
LARGEST_M = 8192  # the rows every candidate's bits are compared with
TIMED_M_FOR_LAST = 4096  # the open-ended last bucket is timed here
KN = ((4096, 4096), (4096, 14336), (14336, 4096))  # the score's matmul shapes

CANDIDATES = tuple(MatmulConfig(bm, bn, 64, 1024, 8, w, st, tma) for bm, bn, w, st, tma in (
    (16, 64, 4, 4, False), (16, 128, 4, 4, False), (64, 64, 4, 4, False), (64, 128, 4, 4, False),
    (128, 128, 8, 4, False), (128, 256, 8, 3, False), (64, 64, 4, 4, True), (64, 128, 4, 4, True),
    (128, 64, 4, 4, True), (128, 128, 8, 4, True), (128, 256, 8, 3, True), (256, 128, 8, 3, True),
))


@dataclass
class BucketResult:
    k: int
    n: int
    top: int | None  # the bucket's largest M (None: no limit)
    timed_m: tuple[int, ...]  # the bucket's first and last M (TIMED_M_FOR_LAST for the open one)
    cublas_us: float  # times are sums over timed_m: a bucket's choice must suit both its ends
    shipped_us: float
    chosen: MatmulConfig
    chosen_us: float
    rejected: list[str] = field(default_factory=list)  # candidates whose bits differed


def tune(kns=KN, dtype=torch.bfloat16, progress=None) -> list[BucketResult]:
    """Time every candidate per (K, N, bucket) on the current GPU; return the choices."""
    results = []
    for k, n in kns:
        results += _tune_shape(k, n, dtype, progress)
    return results


def _tune_shape(k, n, dtype, progress) -> list[BucketResult]:
    from nondet.kernels import bench, triton_matmul

    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=dtype).t()
    x = torch.randn(LARGEST_M, k, device="cuda", dtype=dtype)
    ref = triton_matmul.mm(x, w, cfg=MATMUL_BUCKETS[dtype][-1][1])  # the shipped bits of every row
    out, lo = [], 1
    for top, shipped in shipped_buckets(dtype, n):
        edges = tuple(sorted({lo, top or TIMED_M_FOR_LAST}))
        cublas = sum(bench._bench(lambda m=m: torch.mm(x[:m], w)) for m in edges)
        res = BucketResult(k, n, top, edges, cublas, _time(x, w, shipped, edges), shipped, 0.0)
        res.chosen_us = res.shipped_us
        for cand in CANDIDATES:
            if cand == shipped:
                continue
            if not _keeps_bits_and_is_correct(cand, x, w, ref, edges):
                res.rejected.append(_name(cand))
                continue
            t = _time(x, w, cand, edges)
            if t < MARGIN * res.chosen_us:
                res.chosen, res.chosen_us = cand, t
        out.append(res)
        if progress is not None:
            progress(res)
        lo = (top or 0) + 1
    return out


def _time(x, w, cfg, ms) -> float:
    from nondet.kernels import bench, triton_matmul

    return sum(bench._bench(lambda m=m: triton_matmul.mm(x[:m], w, cfg=cfg)) for m in ms)


def _keeps_bits_and_is_correct(cfg, x, w, ref, ms) -> bool:
    from nondet.kernels import bench, triton_matmul

    for m in ms:
        got = triton_matmul.mm(x[:m], w, cfg=cfg)
        if not bench.same_bits(got, ref[:m]):
            return False
        exact = x[:m].float() @ w.float()
        if ((got.float() - exact).norm() / exact.norm()).item() > 1e-2:
            return False
    return True


def _name(cfg: MatmulConfig) -> str:
    return f"{cfg.block_m}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}{' tma' if cfg.tma else ''}"


def write(results: list[BucketResult], path: Path, dtype=torch.bfloat16) -> dict:
    """The tuned table, keyed by device name and library versions (config.tuning_key)."""
    shapes = {}
    for r in results:
        shapes.setdefault(f"{r.k}x{r.n}", []).append([r.top, asdict(r.chosen)])
    data = {"key": tuning_key(torch.device("cuda", torch.cuda.current_device())),
            "written": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "matmul": {str(dtype).split(".")[-1]: shapes}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    clear_tuning_cache()
    return data


def summary(results: list[BucketResult]) -> list[str]:
    """One line per bucket, then the matmul score part before and after (geometric means)."""
    lines = [f"K={r.k} N={r.n} M<={r.top or 'inf'} (timed at M={', '.join(map(str, r.timed_m))}): "
             f"shipped {r.shipped_us:.1f} us, "
             f"chosen {_name(r.chosen)} {r.chosen_us:.1f} us, cuBLAS {r.cublas_us:.1f} us"
             + (f"; bits differed: {', '.join(r.rejected)}" if r.rejected else "") for r in results]
    before = _geomean([r.cublas_us / r.shipped_us for r in results])
    after = _geomean([r.cublas_us / r.chosen_us for r in results])
    if after > before:
        lines.append(f"matmul ratio over the tuned buckets (geometric mean): shipped {before:.3f} -> tuned {after:.3f}")
    else:
        lines.append(f"no candidate beat the shipped configuration by {100 * (1 - MARGIN):.0f}% in any bucket "
                     f"(geometric mean {before:.3f}): the tuned table repeats the shipped one")
    return lines


def _geomean(xs) -> float:
    return math.exp(sum(math.log(v) for v in xs) / len(xs))
