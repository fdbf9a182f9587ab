"""Decode attention's split-KV path, one launch: the last program of a row tile merges the tile's chunks.

The split launch runs one program per (row tile, batch x kv head, chunk); each writes its chunk's
(max, sum, acc) to a workspace and the last to arrive (an atomic counter per tile) merges chunks
0..n-1 in order. It must give the fused path's bits (one program per tile, merging as it goes)
for every feature, and a row's bits must not depend on the other rows of the batch. Bits are
compared as integers, so even a zero's sign counts.

Under TRITON_INTERPRET=1 on the CPU (a fresh interpreter, as tests/test_kernels_triton.py explains),
where programs run one after another; with NONDET_TEST_DEVICE=cuda the same checks run compiled on
a GPU, where the programs race and the counter decides which one merges.
"""

import os
import pytest
from interpreter import prepare_interpreter, rerun_under_interpreter

INNER = os.environ.get("NONDET_ATTN_SPLIT_INNER") == "1"

if not INNER:

    def test_attention_split_under_interpreter():
        rerun_under_interpreter(__file__, "NONDET_ATTN_SPLIT_INNER")

else:
    import dataclasses

    import torch

    from nondet.kernels import ops, triton_attention
    from nondet.kernels.config import AttentionConfig

    prepare_interpreter()

    # kv_chunk 32 / block_n 16: a few dozen keys span several chunks of two steps each
    ATT_CFG = AttentionConfig(block_m=16, block_n=16, kv_chunk=32, num_warps=4, num_stages=1)
    DEVICE = os.environ.get("NONDET_TEST_DEVICE", "cpu")
    INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16}

    def same_bits(a, b):
        return a.shape == b.shape and torch.equal(a.view(INT_VIEW[a.dtype]), b.view(INT_VIEW[b.dtype]))

    def qkv(b, h, kvh, q_len, s, d=16, dv=16, dtype=torch.float32, seed=0):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(b, h, q_len, d, generator=g).mul(2).to(dtype).to(DEVICE),
                torch.randn(b, kvh, s, d, generator=g).mul(2).to(dtype).to(DEVICE),
                torch.randn(b, kvh, s, dv, generator=g).to(dtype).to(DEVICE))

    def window_mask(q_len, s, window):
        """Bool (1, 1, Q, S): query i at position S - Q + i sees keys in (pos - window, pos]."""
        pos = torch.arange(s - q_len, s)[:, None]
        keys = torch.arange(s)[None, :]
        return ((keys <= pos) & (keys > pos - window))[None, None].to(DEVICE)

    def attend(q, k, v, split, **kw):
        return triton_attention.attention(q, k, v, split=split, cfg=ATT_CFG, **kw)

    def case(name):
        """(q, k, v, keyword arguments of attention) for one named shape; batch 3 unless it says otherwise."""
        b, h, kvh = 3, 8, 2  # GQA, G = 4
        if name == "decode":  # q_len 1; 75 keys: chunks of 32, 32, 11
            return (*qkv(b, h, kvh, 1, 75), {})
        if name == "decode G=4, one kv head, bf16":
            return (*qkv(b, 4, 1, 1, 97, dtype=torch.bfloat16, seed=1), {})
        if name == "rows across a chunk boundary":  # positions 61..65: rows with 2 and 3 chunks in one tile
            return (*qkv(b, h, kvh, 5, 66, seed=2), {})
        if name == "left padding":  # rows start at 0, 7 and 40: their chunks are cut from there
            q, k, v = qkv(b, h, kvh, 3, 100, seed=3)
            return q, k, v, dict(kv_start=torch.tensor([0, 7, 40], dtype=torch.int32, device=DEVICE))
        if name == "bool mask with left padding":
            q, k, v = qkv(b, h, kvh, 4, 90, dtype=torch.bfloat16, seed=4)
            mask = torch.ones(b, 1, 4, 90, dtype=torch.bool, device=DEVICE).tril(90 - 4)
            mask[1, ..., :13] = False
            return q, k, v, dict(mask=mask, kv_start=ops.kv_start_from_mask(mask, b, 90, DEVICE))
        if name == "additive mask":
            q, k, v = qkv(b, h, kvh, 1, 70, seed=5)
            mask = torch.zeros(b, 1, 1, 70, device=DEVICE)
            mask[..., 3:9] = float("-inf")
            mask[..., 50:] = -2.0
            return q, k, v, dict(mask=mask)
        if name == "sliding window":  # each query's chunks start at its own first visible key (37..40: chunk 1)
            q, k, v = qkv(b, h, kvh, 4, 80, seed=6)
            mask = window_mask(4, 80, 40)
            return q, k, v, dict(mask=mask, kv_start=ops.kv_start_from_mask(mask, b, 80, DEVICE),
                                 query_start=ops.first_visible(mask, b, DEVICE))
        if name == "sinks and softcap":
            q, k, v = qkv(b, h, kvh, 2, 81, seed=7)
            sinks = torch.linspace(-2.0, 6.0, h, device=DEVICE)
            return q, k, v, dict(sinks=sinks, softcap=4.0)
        if name == "sinks, a row that sees nothing":  # row 1 starts at S: zeros, the sink notwithstanding
            q, k, v = qkv(b, h, kvh, 1, 64, seed=8)
            start = torch.tensor([5, 64, 33], dtype=torch.int32, device=DEVICE)
            return q, k, v, dict(sinks=torch.full((h,), 1.5, device=DEVICE), kv_start=start)
        if name == "value head dim other than the query's":
            return (*qkv(b, h, kvh, 2, 77, d=24, dv=8, seed=9), {})
        raise KeyError(name)

    CASES = ["decode", "decode G=4, one kv head, bf16", "rows across a chunk boundary", "left padding",
             "bool mask with left padding", "additive mask", "sliding window", "sinks and softcap",
             "sinks, a row that sees nothing", "value head dim other than the query's"]

    def first_row(q, k, v, kw):
        """The call's arguments cut to batch row 0."""
        cut = {key: (val[:1] if key in ("kv_start", "query_start", "mask") else val) for key, val in kw.items()}
        return q[:1], k[:1], v[:1], cut

    @pytest.mark.parametrize("name", CASES)
    def test_split_gives_the_fused_bits(name):
        q, k, v, kw = case(name)
        fused = attend(q, k, v, False, **kw)
        assert same_bits(attend(q, k, v, True, **kw), fused)
        assert fused.abs().sum() > 0  # not vacuous: the kernel wrote values

    @pytest.mark.parametrize("name", CASES)
    def test_split_row_alone_equals_row_in_a_batch(name):
        q, k, v, kw = case(name)
        batch = attend(q, k, v, True, **kw)
        q1, k1, v1, kw1 = first_row(q, k, v, kw)
        assert same_bits(attend(q1, k1, v1, True, **kw1)[0], batch[0])
        assert same_bits(attend(q1, k1, v1, False, **kw1)[0], batch[0])

    @pytest.mark.parametrize("keys", [288, 289, 330])  # 9 / 10 / 11 chunks: blocks of 4 and a rest
    def test_the_blocked_merge_gives_the_one_by_one_merges_bits(keys):
        """The merge loads four chunks per round trip (merge_block 4) and must merge exactly the chunks the
        one-by-one merge does, in the same order: the fused bits, never a merge past the last chunk."""
        q, k, v = qkv(2, 8, 2, 1, keys, dtype=torch.bfloat16, seed=13)
        start = torch.tensor([0, 3], dtype=torch.int32, device=DEVICE)  # row 1: chunks cut from position 3
        one_by_one = dataclasses.replace(ATT_CFG, merge_block=1)
        fused = attend(q, k, v, False, kv_start=start)
        assert ATT_CFG.merge_block == 4
        assert same_bits(attend(q, k, v, True, kv_start=start), fused)
        assert same_bits(triton_attention.attention(q, k, v, split=True, cfg=one_by_one, kv_start=start), fused)

    @pytest.mark.parametrize("name", [c for c in CASES if "mask" in c or c == "sliding window"])
    def test_stopping_at_the_last_visible_key_keeps_the_bits(name):
        """query_end lets a tile stop at its rows' last visible key: only masked positions are skipped."""
        q, k, v, kw = case(name)
        ends = ops.query_end(kw["mask"][..., :k.shape[2]], q.shape[0], DEVICE)
        for split in (False, True):
            assert same_bits(attend(q, k, v, split, query_end=ends, **kw), attend(q, k, v, split, **kw)), split

    def runs_of(kw, s, bsz):
        """(query_end, run_start) as ops.attention_inputs computes them for the case's mask."""
        mask = kw["mask"][..., :s]
        ends = ops.query_end(mask, bsz, DEVICE)
        return ends, ops.run_start(mask, ends, bsz)

    @pytest.mark.parametrize("name", [c for c in CASES if "mask" in c or c == "sliding window"])
    def test_rows_given_as_runs_keep_the_bits(name):
        """A tile whose rows are all runs of keys tests positions instead of loading the mask: the same
        visible set, so the same bits, fused and split; a row that is not a run keeps its tile on the mask."""
        q, k, v, kw = case(name)
        ends, runs = runs_of(kw, k.shape[2], q.shape[0])
        for split in (False, True):
            with_runs = attend(q, k, v, split, query_end=ends, run_start=runs, **kw)
            assert same_bits(with_runs, attend(q, k, v, split, **kw)), split

    def test_ops_find_the_runs_and_only_them():
        """run_start: a causal, a padded, a window and a static cache's rows are runs; a row with a hole,
        an additive mask that adds a value other than 0 where it lets a query see, or a NaN, is not."""
        causal = torch.ones(1, 1, 4, 6, dtype=torch.bool, device=DEVICE).tril(2)
        padded = causal.expand(2, 1, 4, 6).clone()
        padded[1, ..., :2] = False
        cases = {
            "causal": (causal, [[0, 0, 0, 0]]),
            "left padding": (padded, [[0, 0, 0, 0], [2, 2, 2, 2]]),
            "window": (window_mask(4, 6, 2), [[1, 2, 3, 4]]),
        }
        holed = causal.clone()
        holed[..., 2, 1] = False  # query 2 sees 0, 2, 3, 4: not a run
        cases["a hole"] = (holed, [[0, 0, -1, 0]])
        additive = torch.where(causal, 0.0, float("-inf"))
        cases["additive, 0 / -inf"] = (additive, [[0, 0, 0, 0]])
        biased = additive.clone()
        biased[..., 1, 0] = -2.0  # visible, but it changes the score
        cases["additive with a bias"] = (biased, [[0, -1, 0, 0]])
        nan = additive.clone()
        nan[..., 3, 5] = float("nan")
        cases["additive with a NaN"] = (nan, [[0, 0, 0, -1]])
        nothing = torch.zeros(1, 1, 2, 6, dtype=torch.bool, device=DEVICE)
        cases["a row that sees nothing"] = (nothing, [[0, 0]])
        for name, (mask, expected) in cases.items():
            ends = ops.query_end(mask, mask.shape[0], DEVICE)
            assert ops.run_start(mask, ends, mask.shape[0]).tolist() == expected, name

    def test_attention_inputs_give_the_kernel_runs_and_its_mask_dtype(monkeypatch):
        """What ops hands the Triton kernel for a padded bool mask: the mask as int16 (converted in the graph,
        masks.for_kernel), query_end and run_start; with ops.MASK_RUNS off, no runs (the benchmarks' A / B)."""
        q, k, v, kw = case("bool mask with left padding")
        monkeypatch.setattr(ops, "_triton", lambda x: True)  # the CUDA branch, on whatever device this runs
        keys = ops.attention_inputs(q, k, kw["mask"], True, False)
        assert keys.mask.dtype == torch.int16 and torch.equal(keys.mask.bool(), kw["mask"])
        assert keys.query_end.tolist() == [[87, 88, 89, 90]] * 3
        assert keys.run_start.tolist() == [[0] * 4, [13] * 4, [0] * 4]
        assert same_bits(attend(q, k, v, False, mask=keys.mask, kv_start=keys.kv_start, query_end=keys.query_end,
                                run_start=keys.run_start), attend(q, k, v, False, **kw))
        monkeypatch.setattr(ops, "MASK_RUNS", False)
        assert ops.attention_inputs(q, k, kw["mask"], True, False).run_start is None

    def test_a_tile_of_runs_does_not_load_the_mask():
        """Not vacuous: given runs that disagree with the mask (a run that starts later than the mask's
        first visible key), a tile of runs follows the runs, and one row that is not a run (-1) sends its
        tile back to the mask."""
        q, k, v, kw = case("bool mask with left padding")
        ends, runs = runs_of(kw, k.shape[2], q.shape[0])
        assert bool((runs >= 0).all())
        later = runs + 5  # rows would skip their first five visible keys
        from_mask = attend(q, k, v, False, **kw)
        assert not same_bits(attend(q, k, v, False, query_end=ends, run_start=later, **kw), from_mask)
        later[:, 0] = -1  # the tile of query 0 (all four queries x G 4 = 16 rows: one tile) loads the mask
        assert same_bits(attend(q, k, v, False, query_end=ends, run_start=later, **kw), from_mask)

    def test_a_static_cache_decode_reads_no_chunk_past_the_written_keys():
        """A static cache: 200 slots, rows written up to 70 / 33 / 150. Chunks past a row's last written
        key are never read (NaN there cannot reach the output) and the bits are those of the cache cut
        after the chunk holding that key; without query_end the NaN gets in (the check is not vacuous)."""
        q, k, v = qkv(3, 8, 2, 1, 200, dtype=torch.bfloat16, seed=14)
        written = torch.tensor([70, 33, 150], device=DEVICE)
        mask = (torch.arange(200, device=DEVICE)[None, :] < written[:, None])[:, None, None, :]
        v[:, :, 160:] = float("nan")  # past the chunk [128, 160) that holds row 2's last key
        ends = ops.query_end(mask, 3, DEVICE)
        assert ends.flatten().tolist() == [70, 33, 150]
        cut = attend(q, k[:, :, :160], v[:, :, :160], False, mask=mask[..., :160])
        assert not cut.isnan().any()
        for split in (False, True):
            assert same_bits(attend(q, k, v, split, mask=mask, query_end=ends), cut), split
            assert attend(q, k, v, split, mask=mask).isnan().any(), split

    def test_decode_equals_prefill_rows_through_the_split_path():
        q, k, v = qkv(2, 8, 2, 12, 70, seed=10)
        full = attend(q, k, v, False)
        for i in (0, 5, 6, 11):  # positions 59, 64, 65 (a chunk boundary at 64) and 70
            pos = 70 - 12 + i + 1
            assert same_bits(attend(q[:, :, i:i + 1], k[:, :, :pos], v[:, :, :pos], True)[:, 0], full[:, i]), i

    def test_split_is_one_launch(monkeypatch):
        """The merge runs in the chunk programs' own launch; no second kernel."""
        launches, real = [], triton_attention.launch

        def recording(kernel, grid, like):
            launches.append((kernel, grid))
            return real(kernel, grid, like)

        monkeypatch.setattr(triton_attention, "launch", recording)
        q, k, v = qkv(1, 8, 2, 1, 75)
        attend(q, k, v, True)
        assert launches == [(triton_attention._attn_kernel, (1, 2, 3))]  # 1 row tile, 2 kv heads, 3 chunks

    def test_split_bits_repeat():
        """Whichever program arrives last merges; the bits must never depend on which (on a GPU the
        order changes from call to call)."""
        q, k, v = qkv(4, 8, 2, 1, 300, dtype=torch.bfloat16, seed=11)
        first = attend(q, k, v, True)
        for _ in range(50 if DEVICE == "cuda" else 1):  # the interpreter runs programs in one order: once
            assert same_bits(attend(q, k, v, True), first)

    def test_shipped_config_on_a_decode_shape():
        """The shipped bf16 configuration (chunks of 512) on the benchmark's decode heads: 32 query / 8 KV
        heads, head dim 128, a KV length that ends in a short chunk."""
        g = torch.Generator().manual_seed(12)
        q = torch.randn(2, 32, 1, 128, generator=g).to(torch.bfloat16).to(DEVICE)
        k = torch.randn(2, 8, 1100, 128, generator=g).to(torch.bfloat16).to(DEVICE)
        v = torch.randn(2, 8, 1100, 128, generator=g).to(torch.bfloat16).to(DEVICE)
        split = triton_attention.attention(q, k, v, split=True)
        assert same_bits(split, triton_attention.attention(q, k, v, split=False))
        assert same_bits(triton_attention.attention(q[1:], k[1:], v[1:], split=True)[0], split[1])
