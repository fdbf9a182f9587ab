"""Batch-invariant kernels on a CUDA GPU: correctness, row invariance, and a random Qwen3
under HF generate with and without the mode (the run without it is the control: asserted to
differ, tests/controls.py). Results the report needs (distinct completion counts) are written as
JSON to $NONDET_GPU_RESULTS when it is set."""

import contextlib
import json
import os

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.gpu

from controls import mode, require_row0_variance, require_variance, row0_differs  # noqa: E402

from nondet.kernels import reference  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-5}


def _rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _record(key, value):
    path = os.environ.get("NONDET_GPU_RESULTS")
    if not path:
        return
    data = json.load(open(path)) if os.path.exists(path) else {}
    data[key] = value
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_correct_and_row0_invariant(dtype):
    from nondet.kernels import triton_matmul

    torch.manual_seed(0)
    for m, k, n in ((1823, 781, 1000), (37, 61, 29), (300, 4096, 512)):
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(n, k, device="cuda", dtype=dtype).t()
        bias = torch.randn(n, device="cuda", dtype=dtype)
        assert _rel(triton_matmul.mm(a, b, bias), reference.mm(a, b, bias)) < TOL[dtype]
    # K=4096: small M takes the split strategy, large M the fused one; row 0 must not move
    a = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    b = torch.randn(4096, 4096, device="cuda", dtype=dtype).t()
    row0 = triton_matmul.mm(a[:1], b)[0]
    for m in (2, 3, 7, 16, 63, 64, 65, 127, 128, 129, 256, 1000, 4096):
        assert torch.equal(triton_matmul.mm(a[:m], b)[0], row0), m
    assert torch.equal(triton_matmul.mm(a[:64], b, split=True), triton_matmul.mm(a[:64], b, split=False))


def test_a_bound_eager_matmul_keeps_the_jit_launchs_bits():
    # the second eager call of a shape skips Triton's JIT dispatch (bound.py); same binary, same bits
    from nondet.kernels import triton_matmul
    from nondet.kernels.config import matmul_config

    plans = triton_matmul._TMA_PLANS
    plans.clear()
    torch.manual_seed(0)
    a = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    first = triton_matmul.mm(a, w.t())
    if not plans.table:
        pytest.skip("no TMA matmul on this GPU: nothing is bound")
    assert len(plans.table) == 1
    for rows in (512, 300):  # the bound launch, then another shape: its own plan
        unbound = triton_matmul.mm(a[:rows], w.t(), cfg=matmul_config(a.dtype, rows, 4096, 1024, a.device))
        assert torch.equal(triton_matmul.mm(a[:rows], w.t()), unbound), rows
        assert torch.equal(triton_matmul.mm(a[:rows], w.t()), unbound), rows
    assert torch.equal(first, triton_matmul.mm(a, w.t()))
    assert len(plans.table) == 2
    side = torch.cuda.Stream()  # a bound launch runs on the current stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = triton_matmul.mm(a, w.t())
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(on_side, first)


def test_bound_eager_row_launches_keep_the_jit_launchs_bits():
    from nondet.kernels import triton_rows

    triton_rows._PLANS.clear()
    torch.manual_seed(0)
    x = torch.randn(37, 4096, device="cuda", dtype=torch.bfloat16)
    for fn in (triton_rows.mean_last, triton_rows.mean_sq, triton_rows.softmax):
        first = fn(x)  # through the JIT; binds
        assert torch.equal(fn(x), first) and torch.equal(fn(x), first), fn.__name__  # bound
    assert torch.equal(triton_rows.softmax(x, log=True), triton_rows.softmax(x, log=True))
    assert len(triton_rows._PLANS.table) == 4
    assert not torch.equal(triton_rows.softmax(x, log=True), triton_rows.softmax(x))  # LOG is in the key


def test_bmm_and_addmm_invariant():
    from nondet.kernels import triton_matmul

    a = torch.randn(8, 100, 333, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8, 333, 77, device="cuda", dtype=torch.bfloat16)
    assert _rel(triton_matmul.bmm(a, b), reference.bmm(a, b)) < 2e-2
    full = triton_matmul.bmm(a, b)
    assert torch.equal(triton_matmul.bmm(a[:1, :1], b[:1])[0, 0], full[0, 0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_mean_sq_gives_the_bits_of_mean_last_over_stored_squares(dtype):
    """The compiled mode's RMSNorm mean (squares taken in the kernel) against the eager mode's (aten's
    pow writes fp32 squares, then _mean_kernel), at q / k norm and hidden widths and odd lengths;
    past ROW_BLOCK_MAX ops.mean_sq stores the squares itself."""
    from nondet.kernels import ops

    gen = torch.Generator("cuda").manual_seed(7)
    for n in (64, 100, 128, 256, 1000, 2880, 4096, 5120, 8192, 8200):
        x = (torch.randn(300, n, device="cuda", generator=gen) * 3).to(dtype)
        for rows in (1, 7, 300):
            stored = ops.mean_last(x[:rows].float().pow(2), True)
            assert torch.equal(ops.mean_sq(x[:rows], True), stored), (n, rows)
        assert torch.equal(ops.mean_sq(x[1:])[0], ops.mean_sq(x[1:2])[0])  # a misaligned start: the same row bits


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_correct_and_invariant(dtype):
    from nondet.kernels import triton_rows

    torch.manual_seed(0)
    for n in (61, 4096, 151936):
        x = torch.randn(300, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        tol = TOL[dtype] if dtype != torch.float32 else 1e-5
        assert _rel(triton_rows.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6)) < tol
        assert _rel(triton_rows.layer_norm(x, w, w, 1e-5)[0], reference.layer_norm(x, w, w, 1e-5)) < tol
        assert _rel(triton_rows.mean_last(x), reference.mean_last(x)) < tol
        assert _rel(triton_rows.softmax(x), reference.softmax(x)) < tol
        assert _rel(triton_rows.softmax(x, log=True, dtype=torch.float32), reference.softmax(x, log=True)) < 1e-4
        for fn in (lambda t: triton_rows.rms_norm(t, w), lambda t: triton_rows.softmax(t, log=True)):
            row0 = fn(x[:1])[0]
            assert all(torch.equal(fn(x[:m])[0], row0) for m in (2, 3, 64, 300))


def test_attention_correct_prefill_equals_decode():
    from nondet.kernels import triton_attention as ta

    torch.manual_seed(0)
    b, h, kvh, q_len, s, d = 3, 16, 8, 300, 700, 128
    q = torch.randn(b, h, q_len, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, kvh, s, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = ta.attention(q, k, v)
    assert _rel(out, reference.attention(q, k, v)) < 2e-2
    for i in (0, 1, 255, 256, 299):
        pos = s - q_len + i + 1
        dec = ta.attention(q[:, :, i:i + 1], k[:, :, :pos], v[:, :, :pos])
        assert torch.equal(dec[:, 0], out[:, i]), i
        assert torch.equal(ta.attention(q[:1, :, i:i + 1], k[:1, :, :pos], v[:1, :, :pos])[0, 0], out[0, i])
    mask = torch.ones(b, 1, q_len, s, dtype=torch.bool, device="cuda").tril(s - q_len)
    mask[1, ..., :17] = False
    assert _rel(ta.attention(q, k, v, mask), reference.attention(q, k, v, mask)) < 2e-2


@pytest.mark.parametrize("q_len,s,d,masked", [(512, 512, 128, False), (512, 512, 128, True), (1024, 1500, 64, False),
                                               (2048, 2048, 128, False), (37, 1037, 128, False)])
def test_every_attention_tile_gives_the_decode_tiles_bits(q_len, s, d, masked):
    """Longer launches take larger row tiles (config.attention_config: 32 or 128 rows, 4 or 8 warps);
    every row must carry the 16-row decode tile's bits, and a decode's."""
    from nondet.kernels import triton_attention as ta
    from nondet.kernels.config import ATTENTION_CONFIGS

    gen = torch.Generator(device="cuda").manual_seed(q_len + s)
    q = torch.randn(1, 32, q_len, d, generator=gen, device="cuda").bfloat16()
    k = torch.randn(1, 8, s, d, generator=gen, device="cuda").bfloat16()
    v = torch.randn(1, 8, s, d, generator=gen, device="cuda").bfloat16()
    mask = (torch.arange(s, device="cuda")[None, :] <= torch.arange(s - q_len, s, device="cuda")[:, None])[None, None]
    mask = mask if masked else None
    out = ta.attention(q, k, v, mask)
    assert torch.equal(out, ta.attention(q, k, v, mask, cfg=ATTENTION_CONFIGS[torch.bfloat16]))
    for i in (0, q_len // 2, q_len - 1):
        pos = s - q_len + i + 1
        assert torch.equal(ta.attention(q[:, :, i:i + 1], k[:, :, :pos], v[:, :, :pos])[:, 0], out[:, i]), i


def test_masked_chunk_rows_equal_causal_decode_rows():
    """A speculative verification chunk (transformers passes a bool causal mask) gives each
    row the bits of a one-token decode (mask None). Before _row_sum this failed: 2-3 rows in 30
    shapes differed by 1 ULP on an H100, because the masked binary summed p in another layout."""
    from nondet.kernels import triton_attention as ta

    gen = torch.Generator(device="cuda").manual_seed(0)
    h, kvh, d, n = 8, 4, 64, 5
    differing = 0
    for s in list(range(8, 140, 7)) + [255, 256, 257, 511, 512, 513, 700, 1030]:
        q = torch.randn(1, h, s, d, generator=gen, device="cuda").mul(2).bfloat16()
        k = torch.randn(1, kvh, s, d, generator=gen, device="cuda").mul(2).bfloat16()
        v = torch.randn(1, kvh, s, d, generator=gen, device="cuda").bfloat16()
        qpos = torch.arange(s - n, s, device="cuda")[:, None]
        mask = (torch.arange(s, device="cuda")[None, :] <= qpos)[None, None]
        chunk = ta.attention(q[:, :, s - n:], k, v, mask)
        for i, p in enumerate(range(s - n, s)):
            decode = ta.attention(q[:, :, p:p + 1], k[:, :, :p + 1], v[:, :, :p + 1])
            differing += not torch.equal(decode[:, 0], chunk[:, i])
    assert differing == 0


def test_mode_makes_linear_invariant_on_cuda():
    x = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    linear = lambda t: F.linear(t, w)  # noqa: E731
    require_row0_variance(linear, x, "cuBLAS's bf16 linear, row 0 alone vs among 512")
    with mode():
        assert row0_differs(linear, x, (2, 8, 64, 65, 200, 512)) == []


def test_mode_makes_the_row_mean_invariant_on_cuda():
    h = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16).float()
    mean_sq = lambda t: t.pow(2).mean(-1)  # noqa: E731 (HF RMSNorm's mean)
    require_row0_variance(mean_sq, h, "torch's fp32 row mean on CUDA, row 0 alone vs among 512")
    with mode():
        assert row0_differs(mean_sq, h, (2, 512)) == []


def _qwen3(hidden=1024, layers=8, vocab=151936):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=2048)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    model.set_attn_implementation("sdpa")
    return model


class _Recorder:
    """LogitsProcessor that keeps the target row's logits of every step."""

    def __init__(self):
        self.steps = []

    def __call__(self, input_ids, scores):
        self.steps.append(scores[0].clone())
        return scores


def _generate(model, prompt, batch, new_tokens):
    from transformers import LogitsProcessorList

    g = torch.Generator(device="cuda").manual_seed(batch)
    fillers = torch.randint(0, model.config.vocab_size, (batch - 1, prompt.shape[1]), device="cuda", generator=g)
    ids = torch.cat([prompt, fillers])
    rec = _Recorder()
    with torch.no_grad():
        seq = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, logits_processor=LogitsProcessorList([rec]),
                             pad_token_id=0, eos_token_id=None)
    return seq[0, prompt.shape[1]:].tolist(), torch.stack(rec.steps)


BATCHES = (1, 2, 3, 4, 8, 16, 32, 64, 128)


def _sweep(model, prompt, fix):
    """{batch: (tokens, logits of every step)} of the target row at each of BATCHES, 400 steps, with
    the mode (fix) or with the default kernels (its control)."""
    with mode(model=model) if fix else contextlib.nullcontext():
        return {batch: _generate(model, prompt, batch, 400) for batch in BATCHES}


def _counts(sweep):
    """What the report records of a sweep: distinct completions, and each batch against batch 1."""
    toks1, logits1 = sweep[1]
    vs_batch1 = [{"batch": batch, "logits_identical": torch.equal(logits, logits1),
                  "first_divergent_token": next((i for i, (a, b) in enumerate(zip(toks, toks1)) if a != b), None)}
                 for batch, (toks, logits) in sweep.items() if batch != 1]
    return {"distinct": len({tuple(toks) for toks, _ in sweep.values()}), "vs_batch1": vs_batch1}


def test_qwen3_generate_one_completion_with_mode():
    model = _qwen3()
    prompt = torch.randint(0, model.config.vocab_size, (1, 32), device="cuda",
                           generator=torch.Generator(device="cuda").manual_seed(7))
    default, ours = _sweep(model, prompt, fix=False), _sweep(model, prompt, fix=True)
    counts = {"without_mode": _counts(default), "with_mode": _counts(ours)}
    _record("qwen3_generate", counts)
    assert model.config._attn_implementation == "sdpa"  # restored
    require_variance(default[1][1], default[BATCHES[-1]][1],
                     f"a random Qwen3's target row at batch 1 vs {BATCHES[-1]} (400 steps)")
    assert counts["with_mode"]["distinct"] == 1
    assert all(r["logits_identical"] for r in counts["with_mode"]["vs_batch1"])


class _AllRows:
    """LogitsProcessor that keeps every row's logits of every step."""

    def __init__(self):
        self.steps = []

    def __call__(self, input_ids, scores):
        self.steps.append(scores.clone())
        return scores


def _decode_and_prefill(model, prompt, fix):
    """Each generated token's logprob as the decode steps computed it and as one prefill of the whole
    sequence computes it, (B, 300, 1) each: with the mode (fix) or with the default kernels (control)."""
    from transformers import LogitsProcessorList

    rec = _AllRows()
    with mode(model=model) if fix else contextlib.nullcontext(), torch.no_grad():
        seq = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=300,
                             min_new_tokens=300, logits_processor=LogitsProcessorList([rec]),
                             pad_token_id=0, eos_token_id=None)
        fresh = model(seq).logits.float()  # one prefill of the whole sequence
    decode_lp = torch.log_softmax(torch.stack(rec.steps, 1), -1)  # (B, steps, V)
    prefill_lp = torch.log_softmax(fresh[:, prompt.shape[1] - 1:-1], -1)
    tokens = seq[:, prompt.shape[1]:]
    return decode_lp.gather(-1, tokens[..., None]), prefill_lp.gather(-1, tokens[..., None])


def test_qwen3_prefill_equals_decode_with_mode():
    model = _qwen3()
    prompt = torch.randint(0, model.config.vocab_size, (4, 40), device="cuda",
                           generator=torch.Generator(device="cuda").manual_seed(3))
    require_variance(*_decode_and_prefill(model, prompt, fix=False), "a random Qwen3's 300 decode steps vs one prefill")
    dec_tok, pre_tok = _decode_and_prefill(model, prompt, fix=True)
    equal = (dec_tok == pre_tok).float().mean().item()
    _record("prefill_vs_decode_equal_fraction", equal)
    assert torch.equal(dec_tok, pre_tok)
