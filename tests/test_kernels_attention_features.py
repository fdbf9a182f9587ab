"""Attention sinks (gpt-oss), logit softcap (Gemma 2), sliding windows and a value head dim other than
the query's (DeepSeek MLA) in the invariant attention: the CPU path and the Triton kernels (under
TRITON_INTERPRET=1, in a fresh interpreter as tests/test_kernels_triton.py explains).

References are transformers' own eager attention functions for those families, so a misread of
the semantics fails here. Invariance: a row alone equals the same row in a batch, and a prefill
chunk equals one-token decodes, bit for bit, with the features on.
"""

import os
import pytest
from interpreter import prepare_interpreter, rerun_under_interpreter

INNER = os.environ.get("NONDET_ATTN_FEATURES_INNER") == "1"

if not INNER:

    def test_attention_features_under_interpreter():
        rerun_under_interpreter(__file__, "NONDET_ATTN_FEATURES_INNER")

else:
    import types

    import torch

    from nondet.kernels import autograd, cpu, ops, triton_attention
    from nondet.kernels.config import AttentionConfig

    prepare_interpreter()

    ATT_CFG = AttentionConfig(block_m=16, block_n=16, kv_chunk=32, num_warps=4, num_stages=1)
    H, KVH = 4, 2
    DEVICE = os.environ.get("NONDET_TEST_DEVICE", "cpu")  # scripts/gpu.sh attention: "cuda", compiled kernels

    def rel(out, ref):
        return ((out.double() - ref.double()).norm() / ref.double().norm()).item()

    def qkv(b, q_len, s, d=16, dv=16, dtype=torch.float32, seed=3):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(b, H, q_len, d, generator=g, dtype=dtype).mul(2).to(DEVICE),
                torch.randn(b, KVH, s, d, generator=g, dtype=dtype).mul(2).to(DEVICE),
                torch.randn(b, KVH, s, dv, generator=g, dtype=dtype).to(DEVICE))

    def causal_mask(q_len, s, window=None):
        """Bool (1, 1, Q, S): query i at position S - Q + i sees keys <= it (and > it - window)."""
        pos = torch.arange(s - q_len, s)[:, None]
        keys = torch.arange(s)[None, :]
        keep = keys <= pos
        if window is not None:
            keep &= keys > pos - window
        return keep[None, None].to(DEVICE)

    def module(sinks=None):
        return types.SimpleNamespace(num_key_value_groups=H // KVH, sinks=sinks, training=False, head_dim=16)

    def gemma2_reference(q, k, v, mask, scale, softcap):
        from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

        additive = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
        return eager_attention_forward(module(), q, k, v, additive, scaling=scale, softcap=softcap)[0]

    def gpt_oss_reference(q, k, v, mask, scale, sinks):
        from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

        additive = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
        return eager_attention_forward(module(sinks), q, k, v, additive, scaling=scale)[0]

    def run(path, q, k, v, mask=None, softcap=None, sinks=None, split=None, sliding=False):
        """The invariant attention through one path: 'cpu' or 'triton' (the interpreter)."""
        scale = q.shape[-1] ** -0.5
        if path == "cpu":
            start = ops.kv_start_from_mask(mask, q.shape[0], k.shape[2], q.device)
            return cpu.attention(q, k, v, mask, scale, start.tolist(), softcap=softcap, sinks=sinks)
        start = ops.kv_start_from_mask(mask, q.shape[0], k.shape[2], q.device)
        query_start = ops.first_visible(mask, q.shape[0], q.device) if sliding else None
        return triton_attention.attention(q, k, v, mask, scale, start, split=split, cfg=ATT_CFG,
                                          softcap=softcap, sinks=sinks, query_start=query_start)

    PATHS = [("cpu", None), ("triton", False), ("triton", True)]

    @pytest.mark.parametrize("path,split", PATHS)
    def test_softcap_matches_gemma2_eager(path, split):
        q, k, v = qkv(2, 9, 70)
        mask = causal_mask(9, 70)
        ref = gemma2_reference(q, k, v, mask, 0.25, softcap=5.0)
        out = run(path, q, k, v, mask, softcap=5.0, split=split)
        assert rel(out, ref) < 1e-5
        # positive control: the cap changes the result, so the check above is not vacuous
        assert rel(run(path, q, k, v, mask, split=split), ref) > 1e-2

    @pytest.mark.parametrize("path,split", PATHS)
    def test_sinks_match_gpt_oss_eager(path, split):
        q, k, v = qkv(2, 7, 66)
        mask = causal_mask(7, 66)
        sinks = torch.tensor([0.5, 3.0, -1.0, 6.0], device=DEVICE)  # large sinks soak up much of the mass
        ref = gpt_oss_reference(q, k, v, mask, 0.25, sinks)
        out = run(path, q, k, v, mask, sinks=sinks, split=split)
        assert rel(out, ref) < 1e-5
        assert rel(run(path, q, k, v, mask, split=split), ref) > 1e-2

    @pytest.mark.parametrize("path,split", PATHS)
    def test_sliding_window_is_honoured(path, split):
        q, k, v = qkv(1, 6, 50)
        window = causal_mask(6, 50, window=8)
        ref = gpt_oss_reference(q, k, v, window, 0.25, torch.full((H,), -1e4, device=DEVICE))  # a sink that takes nothing
        assert rel(run(path, q, k, v, window, split=split, sliding=True), ref) < 1e-5
        assert rel(run(path, q, k, v, causal_mask(6, 50), split=split), ref) > 1e-2  # ignoring it is wrong

    @pytest.mark.parametrize("path,split", PATHS)
    def test_value_head_dim_other_than_query_dim(path, split):
        q, k, v = qkv(2, 5, 40, d=24, dv=16)
        mask = causal_mask(5, 40)
        out = run(path, q, k, v, mask, split=split)
        assert out.shape == (2, 5, H, 16)
        ref = gemma2_reference(q, k, v, mask, 24 ** -0.5, softcap=None)
        assert rel(out, ref) < 1e-5

    @pytest.mark.parametrize("path,split", PATHS)
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_features_keep_a_row_invariant(path, split, dtype):
        """softcap + sinks + window: row 0 alone == row 0 in a batch; a 5-query chunk == 5 decodes."""
        q, k, v = qkv(3, 5, 45, dtype=dtype)
        sinks = torch.tensor([0.5, 1.0, -1.0, 2.0], device=DEVICE)
        extra = dict(softcap=4.0, sinks=sinks, split=split)
        for window in (None, 10):
            mask = causal_mask(5, 45, window)
            extra["sliding"] = window is not None
            batch = run(path, q, k, v, mask, **extra)
            assert torch.equal(run(path, q[:1], k[:1], v[:1], mask, **extra)[0], batch[0])
            for i in range(5):
                pos = 40 + i + 1
                one = causal_mask(1, pos, window)
                dec = run(path, q[:1, :, i:i + 1], k[:1, :, :pos], v[:1, :, :pos], one, **extra)
                assert torch.equal(dec[0, 0], batch[0, i]), (window, i)

    def grads(fn, tensors):
        for t in tensors:
            t.grad = None
        fn().square().sum().backward()
        return [t.grad.clone() for t in tensors]

    def test_backward_with_softcap_and_sinks_matches_eager():
        """The RL trainer's backward under the mode: softcap (vs Gemma 2 eager) and sinks, whose
        gradient the sinks parameter needs (vs gpt-oss eager)."""
        q, k, v = (t.requires_grad_() for t in qkv(1, 6, 6))
        sinks = torch.tensor([0.5, 1.0, -1.0, 2.0], device=DEVICE, requires_grad=True)
        mask = causal_mask(6, 6)
        ours = grads(lambda: autograd.attention(q, k, v, mask, 0.25, True, 4.0, None), (q, k, v))
        theirs = grads(lambda: gemma2_reference(q, k, v, mask, 0.25, 4.0), (q, k, v))
        assert all(rel(a, b) < 1e-5 for a, b in zip(ours, theirs))
        ours = grads(lambda: autograd.attention(q, k, v, mask, 0.25, True, None, sinks), (q, k, v, sinks))
        theirs = grads(lambda: gpt_oss_reference(q, k, v, mask, 0.25, sinks), (q, k, v, sinks))
        assert all(rel(a, b) < 1e-5 for a, b in zip(ours, theirs))
