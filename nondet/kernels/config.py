"""Fixed kernel configurations: no autotuning; nothing that changes a row's arithmetic depends on M.

A row's result may depend only on that row's data, never on how many rows share the launch.
The reduction order is fixed in ONE place per dtype: for the matmul, `block_k` and `k_chunk`
(K is summed in chunks from zero, each chunk a chain of `tl.dot` steps of `block_k`, chunk sums
added in order); for attention, `block_n` and `kv_chunk`. The matmul's tile shape, warps and
stages may change with M (MATMUL_BUCKETS): every bucket of a dtype shares block_k and k_chunk,
and the device sweeps (docs/benchmarks.md) and `nondet kernels bench`
check bitwise that all buckets give the same bits for every row.
"""

import functools
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch


@dataclass(frozen=True)
class MatmulConfig:
    block_m: int  # rows of A per program; fixed so every row meets the same MMA shape
    block_n: int  # columns of B per program
    block_k: int  # K step of one tl.dot; the order of these steps is the reduction order
    k_chunk: int  # K is summed in chunks of this size (twice this size when K > 4 * k_chunk, so
    #               long K gets fewer restarts), each from zero, then the chunk sums are added in
    #               order: the same arithmetic whether chunks run in one program or in parallel.
    #               The chunk depends on K alone (a property of the weight), never on M.
    group_m: int  # L2-friendly program order; changes scheduling only, never numerics
    num_warps: int
    num_stages: int
    tma: bool = False  # fused launches: persistent kernel fed by TMA descriptors (Hopper+); same K order


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int  # query rows (query positions x heads of one KV group) per program, prefill and decode alike
    block_n: int  # KV positions per inner step
    kv_chunk: int  # KV is split into chunks of this FIXED size, merged in order (never a fixed number of splits)
    num_warps: int
    num_stages: int
    merge_block: int = 4  # chunks the split launch's merge loads at once (1 or 4): speed only, the merges
    #                       stay one per chunk in chunk order (a long cache's merge was a chain of
    #                       dependent L2 round trips, one per chunk)


# fp16/bf16 use the tensor cores; fp32 uses IEEE fma (input_precision="ieee", never TF32).
# bf16/fp16: chosen on an H200 from a CUDA-graph-timed sweep (docs/benchmarks.md) of 128x128 and
# 128x256 tiles with 1024 / 2048 / no K chunks; 128x256x64 was best over the benchmark's shapes.
MATMUL_CONFIGS = {
    torch.bfloat16: MatmulConfig(128, 256, 64, 1024, 8, 8, 3),
    torch.float16: MatmulConfig(128, 256, 64, 1024, 8, 8, 3),
    torch.float32: MatmulConfig(64, 64, 32, 1024, 8, 4, 3),
}

# M buckets for fp16/bf16, (largest M, config), chosen on an H200 from three CUDA-graph-timed
# sweeps (docs/benchmarks.md, 2026-11-23; geometric mean over bench.MATMUL_KN's three (K, N) per M).
# Every bucket keeps block_k 64 and k_chunk 1024 (the K order above); the sweeps found each
# candidate bitwise equal to the 128x256 pointer kernel at every M on four (K, N) shapes.
# 16-row tiles use mma.sync, 64+ rows wgmma: the per-element chain of k16 steps is the same.
# tma=True: the persistent TMA-fed kernel where A and W allow it (else the pointer kernel with
# the same tiles: same bits); 0.80-0.97x cuBLAS at M >= 512 in the third sweep.
_SMALL = MatmulConfig(64, 64, 64, 1024, 8, 4, 4)
_SQUARE = MatmulConfig(128, 128, 64, 1024, 8, 8, 4, tma=True)
_WIDE = MatmulConfig(128, 256, 64, 1024, 8, 8, 3, tma=True)
_DECODE = MatmulConfig(16, 128, 64, 1024, 8, 4, 4)  # decode: W read once, N/128 x chunks programs
_HALF_BUCKETS = (
    (4, _DECODE),  # the two decode buckets differ only by N (_BY_N)
    (16, _DECODE),
    (64, _SMALL),
    (128, MatmulConfig(64, 128, 64, 1024, 8, 4, 4)),
    (256, _SQUARE),  # the 512 bucket's tile; by N below
    (512, _SQUARE),
    (None, _WIDE),  # large M: 128x256 tiles
)
MATMUL_BUCKETS = {
    torch.bfloat16: _HALF_BUCKETS,
    torch.float16: _HALF_BUCKETS,
    torch.float32: ((None, MATMUL_CONFIGS[torch.float32]),),
}

# Between M 129 and 512 the tile also follows N (a chunked prefill, a decode batch past 128): 128x128
# tiles leave narrow N with few programs and wide N with a ragged last wave. `nondet kernels tune`
# (H200, 2026-11-23 and 2026-11-26: every candidate kept the shipped bits) and a per-M timing (H200,
# 2026-11-26, us at M = 129 / 256 / 512, cuBLAS in brackets) chose:
#   K 4096 N 1024:   128x128 16.7 / 16.8 / 19.2 -> 64x128 12.2 / 12.9 / 17.3   (8.5 / 8.5 / 10.8)
#   K 4096 N 4096:   128x128 30.4 / 27.8 / 29.8 -> 64x128 22.4 / 20.1 at M <= 256 (11.4 / 14.7 / 26.8)
#   K 14336 N 4096:  128x128 98.3 / 86.9 / 104.0 -> 64x128 78.1 / 79.6 at M <= 256 (42.0 / 56.4 / 96.8)
#   K 4096 N 14336:  128x128 90.0 / 67.8 / 124.3 -> 128x256 58.9 / 61.1 / 109.4 (35.3 / 51.5 / 100.7)
# On a CUDA device matmul_config then picks 128x128 or 128x256 past M 256 by the rounds each fills (by_waves).
_NARROW = MatmulConfig(64, 128, 64, 1024, 8, 4, 4, tma=True)
# M 65..128 with N <= 2048 (a decode batch's K / V projections) takes the 64-row bucket's 64x64 tile:
# H100 (2026-11-26, gpu_prefill_breakdown.py --sweep 64,128) M 128 K 4096 N 1024 11.4 -> 9.3 us
# (cuBLAS 7.7); wider N within noise either way, N 14336 much slower (61.9 vs 49.0).

# Decode-sized launches (M <= 16, split K) by N: narrower tiles give narrow N (K / V projections) and,
# past 4 rows, wide N (gate / up) more programs. H200 (2026-11-26, gpu_decode_tiles.py of commit
# 899b04d, CUDA graph cycling 4 weight copies past L2, us per matmul, cuBLAS in brackets; none of
# these changed a bit):
#   K 4096 N 1024,  M 1 / 4 / 16:  16x128 8.5 / 9.2 / 9.2-9.4 -> 16x32 s6 8.3 / 7.0 / 6.7-6.9  (6.1-6.2)
#   K 4096 N 14336, M 5..16:       16x128 35.1-37.5           -> 16x64 s6 32.3-32.6          (29.7-32.4)
#   K 4096 N 12288, M 8..16:       16x128 30.4-31.7           -> 16x64 s6 29.3-29.4          (27.4-27.7)
# At M 1 the 16x64 tile was slower on wide N (N 12288: 44.8 vs 29.9 us), so up to 4 rows keep 16x128
# there; N 4096 and K 12288 / 14336 stay within noise of 16x128 at every M.
_DECODE_NARROW = MatmulConfig(16, 32, 64, 1024, 8, 4, 6)
_DECODE_WIDE = MatmulConfig(16, 64, 64, 1024, 8, 4, 6)
_BY_N = {  # bucket's largest M -> ((largest N, config; None: the bucket's own), ...)
    4: ((2048, _DECODE_NARROW), (None, None)),
    16: ((2048, _DECODE_NARROW), (8191, None), (None, _DECODE_WIDE)),
    128: ((2048, _SMALL), (None, None)),
    256: ((8191, _NARROW), (None, _WIDE)),
    512: ((2048, _NARROW), (8191, None), (None, _WIDE)),
}


@functools.lru_cache(maxsize=None)  # on every matmul launch's path: a model has a handful of widths
def shipped_buckets(dtype: torch.dtype, n: int | None = None) -> tuple:
    """The shipped (largest M, config) buckets for a launch with N output columns (any N: None)."""
    buckets = MATMUL_BUCKETS[dtype]
    if n is None or buckets is not _HALF_BUCKETS:
        return buckets
    return tuple((top, _by_n(top, n) or cfg) for top, cfg in buckets)


def _by_n(top: int | None, n: int) -> MatmulConfig | None:
    return next((cfg for widest, cfg in _BY_N.get(top, ()) if widest is None or n <= widest), None)


# block_m 16 keeps decode (a few rows: the heads of one KV group) from wasting the tile.
ATTENTION_CONFIGS = {
    torch.bfloat16: AttentionConfig(16, 128, 512, 4, 2),
    torch.float16: AttentionConfig(16, 128, 512, 4, 2),
    torch.float32: AttentionConfig(16, 32, 512, 4, 1),
}

# Longer launches take larger row tiles (attention_config). A row's arithmetic does not depend on
# block_m, warps or stages: scripts/device/gpu_attention_prefill.py found every tile of 16..128 rows with 4
# or 8 warps and 2 or 3 stages bitwise equal to the 16-row tile (H200, 2026-11-26: causal prefill of
# 512 and 2048, a bool-masked 512, chunks of 5 and 37 queries after a cache). Fastest there, bf16,
# 32/8 heads, head dim 128: causal 2048 rows per KV head 128 rows x 8 warps (37.9 -> 22.7 us at Q
# 512, 385 -> 193 us at Q 2048); from 64 rows, and under a mask, 32 rows x 4 warps (59.8 -> 49.3 us
# masked Q 512; 16.4 -> 14.7 us for a chunk of 37). Speed only: `tests/gpu` holds the bits equal.
# The 128-row tile is for launches whose rows' keys follow from positions (causal, or a mask given as
# runs, ops.run_start): with a mask to load it was slower (58.8 us masked Q 512, H100), since each mask
# element is loaded once per head of the group.
_ATTENTION_BY_ROWS = (  # (fewest rows per KV head, by position only?, (block_m, num_warps, num_stages))
    (1024, True, (128, 8, 2)),
    (64, False, (32, 4, 2)),
)


# A decode launch over a long cache (>= 32 chunks of split programs) takes 8 warps: at B = 1 on an H100
# (2026-11-26, scripts/device/gpu_attention_stages.py, two runs) KV 16k 35.5-35.8 -> 33.8-34.4 us, KV 32k
# 65.6-65.8 -> 63.7-63.9 us (SDPA 29.9 / 51.1-51.4); shorter caches within noise either way.
LONG_CACHE = 16384
# A decode step whose launch has few chunk programs (batch x KV heads x kv_chunk chunks, fewer than
# this) takes 8 warps and 3 stages: each program walks only four 128-key steps, and the deeper
# pipeline hides more of their load latency. H100, 2026-11-27 (scripts/device/gpu_attention_stages.py,
# 32/8 heads, bf16, us vs SDPA): B = 1 KV 1k / 4k / 8k 12.1 / 14.0 / 17.2 -> 10.5 / 11.5 / 13.4
# (0.54 / 0.71 / 0.72x -> 0.63 / 0.86 / 0.92x); B = 2 KV 4k 0.74 -> 0.95x; B = 8 KV 1k 0.80 -> 1.02x.
# At 256 programs and more (B = 1 KV 16k, B = 2 KV 8k, B = 4 KV 4k) it was 0.03-0.07x slower.
FEW_DECODE_PROGRAMS = 256


@functools.lru_cache(maxsize=4096)  # on every attention launch's path; rows vary with prompt length
def attention_config(dtype: torch.dtype, rows: int = 1, by_position: bool = False, head_dim: int = 128,
                     long_cache: bool = False, few_programs: bool = False) -> AttentionConfig:
    """The tile for an attention launch of `rows` query rows per KV head (queries x heads per KV
    head); by_position: the keys a row sees follow from positions (causal, or a mask's rows given as
    runs), no mask loaded per key; head_dim: the larger of q's and v's; long_cache: at least
    LONG_CACHE keys; few_programs: a one-query decode of fewer than FEW_DECODE_PROGRAMS chunk programs.
    block_n and kv_chunk, the order of a row's sum, never move. Head dims past 128
    (Gemma's 256, MLA's 192) keep the 16-row tile: a 128-row one does not fit shared memory there,
    and they were not swept."""
    cfg = ATTENTION_CONFIGS[dtype]
    if dtype == torch.float32 or head_dim > 128:
        return cfg
    for fewest, position_only, (block_m, warps, stages) in _ATTENTION_BY_ROWS:
        if rows >= fewest and (by_position or not position_only):
            return replace(cfg, block_m=block_m, num_warps=warps, num_stages=stages)
    if few_programs:
        return replace(cfg, num_warps=8, num_stages=3)
    return replace(cfg, num_warps=8) if long_cache else cfg


# Row kernels (norms, softmax): a whole row in one program up to this many columns;
# longer rows are walked in blocks of this size, in order.
ROW_BLOCK_MAX = 8192
# Their squares are exact in fp32 (8 or 11 significant bits squared: at most 22 of fp32's 24), so a
# kernel may square them inside its sum without changing a bit (triton_rows._mean_sq_kernel).
SQUARE_EXACT_DTYPES = (torch.bfloat16, torch.float16)

# CPU path: every row of a matmul / reduction is computed inside a call of exactly this many
# rows (the last block padded with zeros), so MKL/oneDNN always sees the same shape.
CPU_ROW_BLOCK = 16


def k_chunk_for(k: int, cfg: MatmulConfig) -> int:
    """The K chunk for a reduction of length k: a function of k (and the dtype's config) only."""
    return cfg.k_chunk if k <= 4 * cfg.k_chunk else 2 * cfg.k_chunk


def matmul_config(dtype: torch.dtype, m: int, k: int | None = None, n: int | None = None,
                  device: torch.device | None = None) -> MatmulConfig:
    """The configuration for an (m x K) @ (K x N) launch: the first bucket that holds m, from the
    tuned table for (dtype, K, N) on this device when one is loaded (tune.py), else the shipped one,
    whose 128x128 or 128x256 tile past M 256 follows the waves it fills on this GPU (by_waves)."""
    cuda = device is not None and device.type == "cuda"
    tuned = tuning(device).get((dtype, k, n)) if cuda else None
    cfg = next(cfg for top, cfg in (tuned or shipped_buckets(dtype, n)) if top is None or m <= top)
    if tuned is None and cuda and n is not None and m > 256 and cfg in (_SQUARE, _WIDE):
        return by_waves(m, n, sm_count(device), sm_smem(device) >= DEEP_SQUARE_SMEM)
    return cfg


# Past M 256 a persistent launch of 128x256 tiles can leave most SMs idle in its last round where
# 128x128 tiles fill it: H100 (2026-11-26, scripts/device/gpu_prefill_breakdown.py --sweep, us, ours vs cuBLAS):
#   M 512 N 12288 (K 4096):  128x256 101.3 (1.45 waves) -> 128x128 92.6 (2.91 waves)   cuBLAS 71.2
#   M 2048 N 1024 (K 4096):  128x256 48.6 (0.48 waves)  -> 128x128 31.1 (0.97 waves)   cuBLAS 23.9
# while 128x256 stays faster where both need as many rounds per tile pair (M 512 N 14336: 103.9 vs
# 116.0; M 2048 N 4096: 102.1 vs 117.4). A 128x256 tile costs about 1.8 of a 128x128 one at full
# rounds (those pairs: 0.90, 0.87). Bits do not move: both tiles keep the dtype's K order.
WIDE_TILE_COST = 1.8  # a 128x256 tile's time in 128x128 tiles


@functools.lru_cache(maxsize=4096)  # on the launch path; a model has a handful of widths and prompt lengths
def by_waves(m: int, n: int, sms: int, deep: bool = False) -> MatmulConfig:
    """_SQUARE (_SQUARE_DEEP with `deep`) or _WIDE for an (m x N) output on `sms` SMs: the fewer rounds
    of programs, weighted by tile cost."""
    def rounds(cfg: MatmulConfig) -> int:
        tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
        return -(-tiles // sms)

    if rounds(_SQUARE) < WIDE_TILE_COST * rounds(_WIDE):
        return _SQUARE_DEEP if deep else _SQUARE
    return _WIDE


# The 128x128 tile with 5 stages in flight where an SM has DEEP_SQUARE_SMEM of shared memory (its A
# and W tiles: 5 x 32 KiB; a Hopper SM has 228 KiB, of which a block may take 227; an A100's 164, 163).
# Same bits (the K order is the dtype's). H200 (2026-11-28, gpu_prefill_breakdown.py --sweep 512, us, 4 -> 5 stages, cuBLAS in
# brackets): K 4096 N 12288 90.4 -> 86.4 (70.8), K 12288 N 4096 79.8 -> 77.3 (68.0), K 14336 N 4096
# 92.0 -> 89.3 (79.2), K = N = 4096 29.7 -> 30.3 (23.8, one full wave: within noise); H100
# (2026-11-26) 3-6% faster at M 512.
_SQUARE_DEEP = replace(_SQUARE, num_stages=5)
DEEP_SQUARE_SMEM = 200 * 1024  # bytes


# A split launch (M <= 128: a program per (tile, K chunk)) runs fastest when all its programs are resident
# at once: a second round of a few programs costs about a round. Its pipeline then drops to 3 stages where
# that fits every program on the SMs and 4 do not. H200 (2026-11-28, gpu_prefill_breakdown.py --sweep 64,
# us): M 64 K 14336 N 4096, 64x64 tiles x 7 chunks = 448 programs, 3 per SM at 4 stages (64 KiB each;
# 396 at once), 4 at 3 stages (528): 50.3 -> 39.8 (cuBLAS 35.8); K 12288 (384 programs, resident at 4
# stages) 35.5 vs 34.6 within noise. Speed only: stages never change the K order. The decode tiles
# (16 rows) keep the stages their own sweeps chose (_DECODE_NARROW / _DECODE_WIDE): not measured this way.
SPLIT_FEWEST_STAGES = 3


def resident_split(cfg: MatmulConfig, programs: int, device: torch.device) -> MatmulConfig:
    """cfg with the most stages (down to SPLIT_FEWEST_STAGES) at which `programs` split programs of a
    64-row or larger tile are all resident on the device's SMs; cfg itself where even the fewest do
    not make them fit, and for decode tiles."""
    if device.type != "cuda" or cfg.block_m < 64:
        return cfg
    tile_bytes = (cfg.block_m + cfg.block_n) * cfg.block_k * 2  # one stage of A and W tiles, 16-bit
    for stages in range(cfg.num_stages, SPLIT_FEWEST_STAGES - 1, -1):
        if programs <= sm_count(device) * (sm_smem(device) // (stages * tile_bytes)):
            return cfg if stages == cfg.num_stages else replace(cfg, num_stages=stages)
    return cfg


@functools.lru_cache(maxsize=None)
def sm_smem(device: torch.device) -> int:
    """Bytes of shared memory of one SM of a CUDA device (what its resident blocks share)."""
    return torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device; 4 elsewhere (the interpreter: small, so the tests exercise every launch strategy)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


# A tuned table (`nondet kernels tune`) replaces the bucket configurations for the (dtype, K, N) it
# lists. It can only move tiles, warps, stages and the TMA flag: block_k and k_chunk (the K
# order) are checked equal to the shipped ones on load, and tune kept only configurations whose
# bits it found equal to the shipped dispatch. It is used only on the device name and library
# versions it was tuned on.
TUNING_ENV = "NONDET_KERNEL_TUNING"  # path of the tuned table; default below


def tuning_path() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nondet" / "kernel-tuning.json"
    return Path(os.environ.get(TUNING_ENV, default))


_TUNING_GENERATION = [0]  # counts clear_tuning_cache calls: launches bound under an older table are not reused


def clear_tuning_cache() -> None:
    """Forget loaded tables (after `nondet kernels tune` wrote one, or in tests)."""
    _load_tuning.cache_clear()
    _tuning_for.cache_clear()
    _TUNING_GENERATION[0] += 1


def tuning_generation() -> int:
    return _TUNING_GENERATION[0]


def tuning_key(device: torch.device) -> dict:
    """What a tuned table must match to be used: device name and library versions."""
    import triton

    return {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "triton": triton.__version__}


@functools.lru_cache(maxsize=None)
def _load_tuning(path: str, key: tuple) -> dict:
    if not os.path.exists(path):
        return {}
    data = json.loads(Path(path).read_text())
    if tuple(sorted(data.get("key", {}).items())) != key:
        return {}
    table = {}
    for dtype_name, shapes in data["matmul"].items():
        dtype = getattr(torch, dtype_name)
        shipped = MATMUL_BUCKETS[dtype][-1][1]
        for kn, buckets in shapes.items():
            k, n = map(int, kn.split("x"))
            cfgs = tuple((top, MatmulConfig(**cfg)) for top, cfg in buckets)
            if any((c.block_k, c.k_chunk) != (shipped.block_k, shipped.k_chunk) for _, c in cfgs):
                raise ValueError(f"{path}: a configuration for {dtype_name} {kn} changes the K order "
                                 "(block_k / k_chunk); delete the file or run nondet kernels tune again")
            table[dtype, k, n] = cfgs
    return table


def tuning(device: torch.device) -> dict:
    """{(dtype, K, N): buckets} of the tuned table for this device, {} when none applies."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _tuning_for(index, os.environ.get(TUNING_ENV))  # cached: this runs on every matmul


@functools.lru_cache(maxsize=None)
def _tuning_for(index: int, env_path: str | None) -> dict:
    key = tuple(sorted(tuning_key(torch.device("cuda", index)).items()))
    return _load_tuning(str(tuning_path()), key)


def tuning_fingerprint(device: torch.device) -> dict | None:
    """For a run's fingerprint: the tuned table in use on this device (path and shapes), or None."""
    table = tuning(device)
    if not table:
        return None
    return {"path": str(tuning_path()), "shapes": sorted(f"{d}".split(".")[-1] + f" {k}x{n}" for d, k, n in table)}
