"""The Triton kernels on the CPU, under TRITON_INTERPRET=1: correct against the torch
references on small irregular shapes, and row 0 bitwise equal across M, with controls: the same checks on
launches whose reduction order follows the batch (a K chunk, a KV chunk, a row walk) fail.

TRITON_INTERPRET must be set before triton is first imported, which another test may already
have done in this process. So the outer test re-runs this file in a fresh interpreter with the
variable set; the checks below are collected only there.
"""

import os
import pytest
from interpreter import prepare_interpreter, rerun_under_interpreter

INNER = os.environ.get("NONDET_TRITON_INNER") == "1"


def record_matmul_launches(monkeypatch, run: bool) -> list:
    """(kernel, DEVICE_DESC) of every launch triton_matmul makes from now on; run=False only records."""
    from nondet.kernels import triton_matmul

    launches, real = [], triton_matmul.launch

    def recording(kernel, grid, like):
        def call(*args, **meta):
            launches.append((kernel, meta.get("DEVICE_DESC")))
            return real(kernel, grid, like)(*args, **meta) if run else None
        return call

    monkeypatch.setattr(triton_matmul, "launch", recording)
    return launches


if not INNER:

    def test_triton_kernels_under_interpreter():
        rerun_under_interpreter(__file__, "NONDET_TRITON_INNER")

    def test_decodes_of_few_chunk_programs_take_the_deeper_pipeline():
        # 32 / 8 heads, 512-key chunks: below 256 programs (B x 8 KV heads x chunks) the decode takes
        # 8 warps and 3 stages; from there on, and for more than one query, the shipped decode tile
        import torch

        from nondet.kernels.triton_attention import few_decode_programs

        bf16 = torch.bfloat16
        assert few_decode_programs(bf16, 1, 1, 8, 1024) and few_decode_programs(bf16, 1, 1, 8, 8192)
        assert few_decode_programs(bf16, 2, 1, 8, 4096) and few_decode_programs(bf16, 8, 1, 8, 1024)
        assert not few_decode_programs(bf16, 1, 1, 8, 16384) and not few_decode_programs(bf16, 4, 1, 8, 4096)
        assert not few_decode_programs(bf16, 1, 5, 8, 1024)  # a verification of 5 rows

    def test_matmul_builds_tma_descriptors_in_the_kernel_in_a_trace_and_by_default_in_eager(monkeypatch):
        # Inductor fails on host descriptors built in a triton_op's body, so a trace always builds them
        # in the kernel; eager does too unless EAGER_DEVICE_DESC is off (host descriptors cost ~30 us
        # of host time per matmul). Dispatch only: nothing is launched.
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        from nondet.kernels import triton_matmul
        from nondet.kernels.config import MatmulConfig

        tma_cfg = MatmulConfig(16, 16, 16, 32, 2, 4, 1, tma=True)  # 3 x 3 tiles: no split at 4 "SMs"
        launches = record_matmul_launches(monkeypatch, run=False)

        def mm(offset: int):  # A (37, 64) at `offset` elements into its storage
            a = torch.randn(offset + 37 * 64, dtype=torch.bfloat16)[offset:].view(37, 64)
            triton_matmul.mm(a, torch.randn(48, 64, dtype=torch.bfloat16).t(), cfg=tma_cfg)

        mm(0)
        monkeypatch.setattr(triton_matmul, "EAGER_DEVICE_DESC", False)
        mm(0)
        with FakeTensorMode():
            mm(0)
            mm(64)  # one row in: 128 bytes, still aligned
            mm(1)  # 2 bytes past an aligned address: no TMA, traced or not
        tma, pointer = triton_matmul._mm_tma_kernel, triton_matmul._mm_kernel
        assert launches == [(tma, True), (tma, False), (tma, True), (tma, True), (pointer, None)]

else:
    from dataclasses import replace

    import torch

    from nondet.kernels import reference, triton_attention, triton_matmul, triton_rows
    from nondet.kernels.config import AttentionConfig, MatmulConfig

    prepare_interpreter()

    # Small tiles and a small K chunk keep the interpreter fast and make K=29..200 span chunks,
    # so the split and fused strategies are both exercised.
    MM_CFG = MatmulConfig(block_m=16, block_n=16, block_k=16, k_chunk=32, group_m=2, num_warps=4, num_stages=1)
    ATT_CFG = AttentionConfig(block_m=16, block_n=16, kv_chunk=32, num_warps=4, num_stages=1)
    TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}

    def row0_differs(fn, x, ms) -> list[int]:
        """The row counts m at which fn(x[:m])'s row 0 has other bits than fn(x[:1])'s."""
        row0 = fn(x[:1])[0]
        return [m for m in ms if not torch.equal(fn(x[:m])[0], row0)]

    def rows_in_blocks_from_batch_3(fn):
        """fn with its rows walked in blocks of 16 from 3 rows on: a reduction order picked by the batch."""
        def by_batch(rows):
            whole = triton_rows.ROW_BLOCK_MAX
            triton_rows.ROW_BLOCK_MAX = 16 if len(rows) >= 3 else whole
            try:
                return fn(rows)
            finally:
                triton_rows.ROW_BLOCK_MAX = whole
        return by_batch

    def rel(out, ref):
        return ((out.double() - ref.double()).norm() / ref.double().norm()).item()

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_matmul_correct_on_irregular_shapes(dtype):
        torch.manual_seed(0)
        a = torch.randn(37, 61, dtype=dtype)
        b = torch.randn(29, 61, dtype=dtype).t()  # a transposed weight, as F.linear passes it
        bias = torch.randn(29, dtype=dtype)
        for split in (False, True):
            assert rel(triton_matmul.mm(a, b, cfg=MM_CFG, split=split), reference.mm(a, b)) < TOL[dtype]
            out = triton_matmul.mm(a, b, bias, cfg=MM_CFG, split=split)
            assert rel(out, reference.mm(a, b, bias)) < TOL[dtype]
        # the default configuration too (one tile here)
        assert rel(triton_matmul.mm(a, b), reference.mm(a, b)) < TOL[dtype]
        x = torch.randn(3, 5, 61, dtype=dtype)
        y = torch.randn(3, 61, 29, dtype=dtype)
        assert rel(triton_matmul.bmm(x, y, cfg=MM_CFG), reference.bmm(x, y)) < TOL[dtype]
        # split over K with a batch: each (batch entry, tile) has its own arrival counter
        assert torch.equal(triton_matmul.bmm(x, y, cfg=MM_CFG, split=True),
                           triton_matmul.bmm(x, y, cfg=MM_CFG, split=False))

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_matmul_row0_bitwise_equal_across_m(dtype):
        torch.manual_seed(1)
        a = torch.randn(33, 70, dtype=dtype)  # K=70: three K chunks, the last one short
        b = torch.randn(70, 24, dtype=dtype)
        ms = (*range(1, 10), 15, 16, 17, 32, 33)  # around the 16-row tile boundaries
        assert row0_differs(lambda rows: triton_matmul.mm(rows, b, cfg=MM_CFG), a, ms) == []
        # the control: the same check on a launch whose K chunk (its reduction order) follows M, the
        # split-K defect, fails (in fp32: rounded to bf16, this reorder's 1-ulp fp32 changes vanish here)
        by_m = lambda rows: triton_matmul.mm(rows.float(), b.float(),
                                             cfg=MM_CFG if len(rows) < 16 else replace(MM_CFG, k_chunk=64))
        assert row0_differs(by_m, a, ms) == [16, 17, 32, 33]
        # the two launch strategies give the same bits, not just close ones
        fused = triton_matmul.mm(a, b, cfg=MM_CFG, split=False)
        assert torch.equal(triton_matmul.mm(a, b, cfg=MM_CFG, split=True), fused)
        # the split's chunk sums added by the rolled loop (one round trip per chunk) or unrolled: same bits
        try:
            triton_matmul.UNROLL_CHUNK_SUM = False
            assert torch.equal(triton_matmul.mm(a, b, cfg=MM_CFG, split=True), fused)
        finally:
            triton_matmul.UNROLL_CHUNK_SUM = True

    def test_matmul_fp32_is_ieee_not_tf32():
        # fp32 products must not be rounded to tf32's 10-bit mantissa
        a = torch.full((1, 16), 1.0 + 2.0 ** -20)
        b = torch.ones(16, 16)
        assert torch.equal(triton_matmul.mm(a, b, cfg=MM_CFG), a @ b)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_row_kernels_correct(dtype):
        torch.manual_seed(2)
        x = torch.randn(2, 9, 61, dtype=dtype)
        w = torch.randn(61, dtype=dtype)
        tol = TOL[dtype]
        assert rel(triton_rows.mean_last(x, keepdim=True), reference.mean_last(x, keepdim=True)) < tol
        assert rel(triton_rows.sum_last(x, keepdim=True), x.double().sum(-1, keepdim=True)) < tol
        assert triton_rows.sum_last(x).shape == (2, 9)
        assert rel(triton_rows.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6)) < tol
        assert rel(triton_rows.layer_norm(x, w, w, 1e-5)[0], reference.layer_norm(x, w, w, 1e-5)) < tol
        assert rel(triton_rows.softmax(x), reference.softmax(x)) < tol
        lsm = triton_rows.softmax(x, log=True, dtype=torch.float32)
        assert rel(lsm, reference.softmax(x, log=True)) < 1e-5

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_mean_sq_gives_mean_last_over_the_stored_squares(dtype):
        # the summation layout is held equal by tests/test_kernels_ttgir_rows.py; here the arithmetic
        torch.manual_seed(5)
        for n in (61, 128, 1000):
            x = (torch.randn(5, 3, n) * 3).to(dtype)
            got = triton_rows.mean_sq(x, keepdim=True)
            assert got.dtype == torch.float32 and got.shape == (5, 3, 1)
            assert torch.equal(got, triton_rows.mean_last(x.float().pow(2), keepdim=True)), n
        assert triton_rows.mean_sq(x).shape == (5, 3)
        # one block per row, and only squares exact in fp32: ops.mean_sq stores the squares for the rest
        with pytest.raises(ValueError, match="at most"):
            triton_rows.mean_sq(torch.randn(2, triton_rows.ROW_BLOCK_MAX + 1, dtype=dtype))
        with pytest.raises(ValueError, match="bf16 / fp16"):
            triton_rows.mean_sq(torch.randn(2, 64))

    def test_row_kernels_walk_long_rows_in_blocks(monkeypatch):
        monkeypatch.setattr(triton_rows, "ROW_BLOCK_MAX", 16)
        x = torch.randn(3, 61)
        assert rel(triton_rows.softmax(x, log=True), reference.softmax(x, log=True)) < 1e-5
        assert rel(triton_rows.rms_norm(x), reference.rms_norm(x, None, 1e-6)) < 1e-5

    def test_row_kernels_row0_bitwise_equal_across_m():
        torch.manual_seed(3)
        x = torch.randn(12, 61, dtype=torch.bfloat16)
        w = torch.randn(61, dtype=torch.bfloat16)
        fns = [lambda t: triton_rows.rms_norm(t, w), triton_rows.mean_sq, lambda t: triton_rows.softmax(t),
               lambda t: triton_rows.layer_norm(t, w, w)[0]]
        for i, fn in enumerate(fns):
            assert row0_differs(fn, x, (2, 3, 7, 12)) == [], i
        # fp32 rows for the sums: a sum of 61 bf16 values is exact in fp32, so no order could change its bits.
        # The control: the same kernel walking its rows in blocks of 16 from batch 3 on (a reduction order
        # picked by the batch) fails the check. Under the interpreter that walk leaves rms_norm's and softmax's
        # bits unchanged on this data, so their checks have no control here; tests/gpu checks them on a GPU.
        torch.manual_seed(3)
        x, w = torch.randn(12, 61), torch.randn(61)
        for i, fn in enumerate([triton_rows.mean_last, triton_rows.sum_last,
                                lambda t: triton_rows.layer_norm(t, w, w)[0]]):
            assert row0_differs(fn, x, (2, 3, 7, 12)) == [], i
            assert row0_differs(rows_in_blocks_from_batch_3(fn), x, (2, 3, 7, 12)) == [3, 7, 12], i

    def _qkv(b, h, kvh, q_len, s, d, dtype=torch.float32, seed=4):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(b, h, q_len, d, generator=g, dtype=dtype),
                torch.randn(b, kvh, s, d, generator=g, dtype=dtype),
                torch.randn(b, kvh, s, d, generator=g, dtype=dtype))

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_attention_correct_causal_gqa(dtype):
        q, k, v = _qkv(2, 4, 2, 9, 75, 16, dtype)
        for split in (False, True):
            out = triton_attention.attention(q, k, v, split=split, cfg=ATT_CFG)
            assert rel(out, reference.attention(q, k, v)) < TOL[dtype] * 2

    def test_attention_masks():
        q, k, v = _qkv(2, 4, 2, 9, 40, 16)
        mask = torch.ones(2, 1, 9, 40, dtype=torch.bool).tril(40 - 9)
        mask[1, ..., :6] = False  # left padding on row 1
        out = triton_attention.attention(q, k, v, mask, cfg=ATT_CFG)
        assert rel(out, reference.attention(q, k, v, mask)) < 1e-5
        additive = torch.zeros(2, 1, 9, 40).masked_fill(~mask, float("-inf"))
        assert rel(triton_attention.attention(q, k, v, additive, cfg=ATT_CFG), reference.attention(q, k, v, mask)) < 1e-5

    def test_attention_decode_equals_prefill_bitwise():
        q, k, v = _qkv(2, 4, 2, 12, 70, 16)
        full = triton_attention.attention(q, k, v, cfg=ATT_CFG, split=False)
        for i in (0, 1, 5, 11):  # positions 59, 60, 64 (a chunk boundary) and 70
            pos = 70 - 12 + i + 1
            dec = triton_attention.attention(q[:, :, i:i + 1], k[:, :, :pos], v[:, :, :pos], cfg=ATT_CFG, split=True)
            assert torch.equal(dec[:, 0], full[:, i]), i

    def test_attention_verification_chunk_with_a_bool_mask_equals_decodes_without_one():
        # speculative decoding: plain decoding passes no mask (the causal path); a verification
        # chunk of k+1 rows after the cache passes a bool causal mask. Same bits for every row.
        q, k, v = _qkv(1, 4, 2, 5, 70, 16, torch.bfloat16)
        mask = torch.ones(1, 1, 5, 70, dtype=torch.bool).tril(70 - 5)
        for split in (False, True):
            chunk = triton_attention.attention(q, k, v, mask, cfg=ATT_CFG, split=split)
            for i in range(5):
                pos = 70 - 5 + i + 1
                dec = triton_attention.attention(q[:, :, i:i + 1], k[:, :, :pos], v[:, :, :pos], cfg=ATT_CFG)
                assert torch.equal(chunk[:, i], dec[:, 0]), (split, i)

    def test_attention_row0_invariant_to_batch_and_left_padding():
        q, k, v = _qkv(5, 4, 2, 1, 70, 16, torch.bfloat16)
        solo = triton_attention.attention(q[:1], k[:1], v[:1], cfg=ATT_CFG)
        for b in (2, 5):
            assert torch.equal(triton_attention.attention(q[:b], k[:b], v[:b], cfg=ATT_CFG)[0], solo[0])
            # the control: KV split in chunks by the batch's size (split-KV's defect) changes row 0's bits
            by_b = replace(ATT_CFG, kv_chunk=16)
            assert not torch.equal(triton_attention.attention(q[:b], k[:b], v[:b], cfg=by_b)[0], solo[0])
        # the same request behind 7 padding positions, in a batch of 2
        pad = 7
        kp = torch.cat([torch.randn(2, 2, pad, 16).to(k.dtype), k[:2]], dim=2)
        vp = torch.cat([torch.randn(2, 2, pad, 16).to(v.dtype), v[:2]], dim=2)
        mask = torch.ones(2, 1, 1, 70 + pad, dtype=torch.bool)
        mask[0, ..., :pad] = False
        start = torch.tensor([pad, 0], dtype=torch.int32)
        padded = triton_attention.attention(q[:2], kp, vp, mask, kv_start=start, cfg=ATT_CFG)
        assert torch.equal(padded[0], solo[0])

    def test_attention_packed_row_cut_into_sequences_gives_each_its_own_bits():
        # RL trainers pack sequences into one row under a block-diagonal mask. Sequence B starts at
        # key 40, so inside the row its keys fall into chunks cut at 0, 32, 64 (not 40, 72): other
        # sums than its own decode. Cut into sequences (packed.py), each gets its own bits.
        from nondet.kernels import packed

        q, k, v = _qkv(1, 4, 2, 90, 90, 16, torch.bfloat16, seed=9)
        mask = torch.zeros(1, 1, 90, 90, dtype=torch.bool)
        mask[..., :40, :40] = torch.ones(40, 40, dtype=torch.bool).tril()
        mask[..., 40:, 40:] = torch.ones(50, 50, dtype=torch.bool).tril()
        bounds = packed.segments(mask, 90, 90)
        assert bounds == [(0, 40), (40, 90)]
        alone = triton_attention.attention(q[:, :, 40:], k[:, :, 40:], v[:, :, 40:], cfg=ATT_CFG)
        whole = triton_attention.attention(q, k, v, mask, cfg=ATT_CFG)
        assert not torch.equal(whole[:, 40:].view(torch.int16), alone.view(torch.int16))  # the hazard is real
        cut = packed.per_segment(lambda a, b, c: triton_attention.attention(a, b, c, cfg=ATT_CFG), q, k, v, bounds)
        assert torch.equal(cut[:, 40:].view(torch.int16), alone.view(torch.int16))
        assert rel(cut, reference.attention(q, k, v, mask)) < TOL[torch.bfloat16] * 2

    @pytest.mark.parametrize("masked", [False, True])
    def test_attention_longer_launches_take_larger_tiles_with_the_decode_tiles_bits(masked):
        # attention_config gives a causal launch of >= 1024 rows per KV head 128-row tiles and a
        # masked one 32-row tiles; each row must keep the bits the 16-row decode tile gives it
        from nondet.kernels.config import ATTENTION_CONFIGS, attention_config

        q, k, v = _qkv(1, 8, 2, 256, 300, 64, torch.bfloat16)  # 256 queries x G 4 = 1024 rows per KV head
        mask = torch.ones(1, 1, 256, 300, dtype=torch.bool).tril(300 - 256) if masked else None
        chosen = attention_config(torch.bfloat16, 1024, by_position=not masked, head_dim=64)
        assert chosen.block_m == (32 if masked else 128)
        shipped = ATTENTION_CONFIGS[torch.bfloat16]
        assert (chosen.block_n, chosen.kv_chunk) == (shipped.block_n, shipped.kv_chunk)
        # a decode over a long cache keeps the decode tile and the K order, with 8 warps (speed only)
        long = attention_config(torch.bfloat16, 4, by_position=not masked, long_cache=True)
        assert (long.block_m, long.block_n, long.kv_chunk, long.num_warps) == (16, shipped.block_n, shipped.kv_chunk, 8)
        # a decode of few chunk programs, the same, with 8 warps and 3 stages (speed only)
        few = attention_config(torch.bfloat16, 4, by_position=not masked, few_programs=True)
        assert (few.block_m, few.block_n, few.kv_chunk, few.num_warps, few.num_stages) == (
            16, shipped.block_n, shipped.kv_chunk, 8, 3)
        small = triton_attention.attention(q, k, v, mask, cfg=shipped)
        assert torch.equal(triton_attention.attention(q, k, v, mask), small)
        for i in (0, 211, 255):
            pos = 300 - 256 + i + 1
            dec = triton_attention.attention(q[:, :, i:i + 1], k[:, :, :pos], v[:, :, :pos])
            assert torch.equal(dec[:, 0], small[:, i]), i

    def _columns(n: int) -> int:
        """Output columns computed for a width-n case: n, or for a wide n (past 8191, where the wide tiles
        start) 264, two 256-column tiles with a ragged edge. A row's bits follow its tile shape and K
        order, not how many column tiles sit beside it; 8200 columns only cost the interpreter a minute."""
        return n if n <= 8191 else 264

    def _mm_tiled_for(a, b, n: int):
        """triton_matmul.mm of a @ b with the tiles, and the launch, an (M x n) output gets (b may be narrower)."""
        from nondet.kernels.config import matmul_config

        m, k = a.shape
        if b.shape[1] == n:
            return triton_matmul.mm(a, b)  # the dispatch itself
        cfg = matmul_config(a.dtype, m, k, n)
        assert not triton_matmul.use_split(1, m, n, k, cfg, a.device, 4)  # n wide: the unsplit launch
        return triton_matmul.mm(a, b, cfg=cfg, split=False)

    @pytest.mark.parametrize("n", [24, 8200])
    def test_matmul_prefill_bucket_by_width_gives_the_largest_ms_bits(n):
        # M 129..512 takes 64x128 TMA tiles for narrow N and 128x256 for wide N, M 65..128 64x64 tiles
        # for narrow N (shipped_buckets)
        from nondet.kernels.config import matmul_config

        torch.manual_seed(6)
        a = torch.randn(516, 136, dtype=torch.bfloat16)
        b = torch.randn(_columns(n), 136, dtype=torch.bfloat16).t()
        assert matmul_config(torch.bfloat16, 300, 136, n).block_n == (128 if n == 24 else 256)
        assert matmul_config(torch.bfloat16, 100, 136, n).block_n == (64 if n == 24 else 128)
        full = _mm_tiled_for(a, b, n)
        for m in (64, 65, 128, 129, 256, 257, 512, 513):
            assert torch.equal(_mm_tiled_for(a[:m], b, n).view(torch.int16), full[:m].view(torch.int16)), m

    @pytest.mark.parametrize("n", [24, 8200])
    def test_matmul_decode_buckets_by_width_give_the_largest_ms_bits(n):
        # M <= 16 takes 16x32 tiles for narrow N, 16x128 up to 4 rows and 16x64 past them for wide N;
        # K 1100 is two chunks, so narrow N splits K over programs (the interpreter has 4 "SMs")
        from nondet.kernels.config import matmul_config

        assert [matmul_config(torch.bfloat16, m, 1100, n).block_n for m in (1, 4, 5, 16)] == \
            ([32] * 4 if n == 24 else [128, 128, 64, 64])
        assert matmul_config(torch.bfloat16, 10, 1100, 4096).block_n == 128
        torch.manual_seed(7)
        a = torch.randn(20, 1100, dtype=torch.bfloat16)
        b = torch.randn(_columns(n), 1100, dtype=torch.bfloat16).t()
        full = _mm_tiled_for(a, b, n)
        for m in (1, 4, 5, 16, 17):
            assert torch.equal(_mm_tiled_for(a[:m], b, n).view(torch.int16), full[:m].view(torch.int16)), m

    def test_attention_kv_start_outside_the_cache_is_clamped():
        # an unwritten kv_start buffer handed the decode kernel garbage that addressed
        # outside K/V. Below 0 it now means 0, at or past S the row sees nothing (zeros).
        q, k, v = _qkv(3, 4, 2, 1, 70, 16)
        zero = triton_attention.attention(q, k, v, kv_start=torch.zeros(3, dtype=torch.int32), cfg=ATT_CFG)
        start = torch.tensor([-2**31, 70, 2**31 - 1], dtype=torch.int32)
        for split in (False, True):
            out = triton_attention.attention(q, k, v, kv_start=start, cfg=ATT_CFG, split=split)
            assert torch.equal(out[0], zero[0]), split
            assert torch.equal(out[1:], torch.zeros_like(out[1:])), split

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_matmul_m_buckets_give_row_bits_of_the_largest_m(dtype):
        # the shipped dispatch: each M takes its bucket's tile shape (16x64 .. 128x256 for bf16);
        # every row must carry the bits it has at the largest M, across every bucket edge
        from nondet.kernels.config import MATMUL_BUCKETS

        torch.manual_seed(5)
        edges = [top for top, _ in MATMUL_BUCKETS[dtype] if top is not None]
        a = torch.randn(max(edges, default=16) + 3, 136, dtype=dtype)  # K=136: a ragged last K step,
        b = torch.randn(24, 136, dtype=dtype).t()  # rows of 16-byte multiples: the TMA buckets run TMA
        full = triton_matmul.mm(a, b)
        for m in sorted({1, 2, *edges, *(e + 1 for e in edges), a.shape[0]}):
            assert torch.equal(triton_matmul.mm(a[:m], b).view(torch.int16 if dtype != torch.float32 else torch.int32),
                               full[:m].view(torch.int16 if dtype != torch.float32 else torch.int32)), m

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_matmul_tma_persistent_kernel_gives_the_pointer_kernels_bits(dtype, monkeypatch):
        # the large-M bucket's persistent TMA kernel: same chunks, same dot chain, same bits
        tma_cfg = MatmulConfig(16, 16, 16, 32, 2, 4, 1, tma=True)
        launched = []
        real = triton_matmul._mm_tma
        monkeypatch.setattr(triton_matmul, "_mm_tma", lambda *args: launched.append(1) or real(*args))
        torch.manual_seed(6)
        a = torch.randn(37, 72, dtype=dtype)  # K=72: chunks of 32, 32 and 8 (a ragged last step)
        w = torch.randn(29, 72, dtype=dtype)  # a weight as nn.Linear stores it
        bias = torch.randn(29, dtype=dtype)
        for b in (None, bias):
            ref = triton_matmul.mm(a, w.t(), b, cfg=MM_CFG, split=False)
            out = triton_matmul.mm(a, w.t(), b, cfg=tma_cfg)
            assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
            assert rel(out, reference.mm(a, w.t(), b)) < 1e-2
        assert len(launched) == 2  # the TMA path ran, not the pointer fallback

    @pytest.mark.parametrize("split", [False, True])
    def test_a_batched_launch_of_strided_leaves_gives_each_leafs_own_mm_bits(split):
        # --tp-invariant's TP1 (tp_tree.tree_linear): the K halves of x as a strided view, the weight's halves
        # stacked, one bmm; each entry must have the bits of the mm a TP2 rank runs on its own contiguous
        # shard (TMA included).
        tma_cfg = MatmulConfig(16, 16, 16, 32, 2, 4, 1, tma=True)
        torch.manual_seed(8)
        k = 520  # a leaf's K: 16 chunks of 32 and a ragged 8
        x, w = torch.randn(21, 2 * k, dtype=torch.bfloat16), torch.randn(40, 2 * k, dtype=torch.bfloat16)
        leaves = x.reshape(21, 2, k).transpose(0, 1)  # (2, 21, k), rows 2k apart
        chunks = w.reshape(40, 2, k).transpose(0, 1).contiguous()
        batched = triton_matmul.bmm(leaves, chunks.transpose(1, 2), cfg=MM_CFG, split=split)
        for i in (0, 1):
            rank = x[:, i * k:(i + 1) * k].contiguous(), w[:, i * k:(i + 1) * k].contiguous().t()
            for cfg in (MM_CFG, tma_cfg):
                assert torch.equal(batched[i].view(torch.int16), triton_matmul.mm(*rank, cfg=cfg).view(torch.int16))
        # control: the leaves rounded and added are not the whole-K product (the comparison sees the rounding)
        assert not torch.equal((batched[0].float() + batched[1].float()).bfloat16(), triton_matmul.mm(x, w.t(), cfg=MM_CFG))

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_matmul_tma_kernel_building_its_own_descriptors_gives_the_same_bits(dtype, monkeypatch):
        # a traced graph's launch (DEVICE_DESC: descriptors made in the kernel from the raw tensors)
        # against eager's host descriptors and the pointer kernel
        tma_cfg = MatmulConfig(16, 16, 16, 32, 2, 4, 1, tma=True)
        torch.manual_seed(7)
        a = torch.randn(42, 72, dtype=dtype)[5:]  # 37 rows, 720 bytes into the storage: a view, as graphs pass
        w = torch.randn(29, 72, dtype=dtype)  # K=72: chunks of 32, 32 and 8 (a ragged last step)
        bias = torch.randn(29, dtype=dtype)
        launches = record_matmul_launches(monkeypatch, run=True)
        out = {}
        for device_desc in (False, True):
            monkeypatch.setattr(triton_matmul, "_device_desc", lambda t, d=device_desc: d)
            out[device_desc] = [triton_matmul.mm(a, w.t(), b, cfg=tma_cfg) for b in (None, bias)]
        assert launches == [(triton_matmul._mm_tma_kernel, d) for d in (False, False, True, True)]
        for i, b in enumerate((None, bias)):
            ref = triton_matmul.mm(a, w.t(), b, cfg=MM_CFG, split=False)
            assert torch.equal(out[True][i].view(torch.int16), out[False][i].view(torch.int16))
            assert torch.equal(out[True][i].view(torch.int16), ref.view(torch.int16))
            assert rel(out[True][i], reference.mm(a, w.t(), b)) < 1e-2
