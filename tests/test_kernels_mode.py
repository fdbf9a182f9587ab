"""The mode: nesting, exact restoration (also on exceptions), op classes one at a time, the
transformers attention switch, and a tiny Qwen3 under HF generate that is batch-invariant."""

import contextlib

import pytest
import torch
from controls import mode, require_variance

from nondet.kernels import ATTN_IMPLEMENTATION, OP_CLASSES, active_ops, batch_invariant, is_active


def overridden(op: str) -> bool:
    """Whether our kernel currently sits on aten::op's CPU dispatch key."""
    dump = torch._C._dispatch_dump(f"aten::{op}")
    return any(line.startswith("CPU:") and "nondet" in line for line in dump.splitlines())


def state():
    return active_ops(), {op: overridden(op) for op in ("mm", "addmm", "bmm", "mean.dim", "_softmax", "_log_softmax", "topk")}


def test_op_classes_and_default_off():
    assert OP_CLASSES == ("matmul", "norm", "attention", "softmax", "experts", "router", "elementwise")
    assert active_ops() == frozenset() and not is_active()
    assert not any(state()[1].values())


def test_nesting_replaces_and_restores_exactly():
    before = state()
    with batch_invariant():
        outer = state()
        assert outer[0] == frozenset(OP_CLASSES) and all(outer[1].values())
        with batch_invariant(ops={"matmul"}):
            assert active_ops() == {"matmul"} and is_active("matmul") and not is_active("norm")
            assert overridden("mm") and not overridden("mean.dim") and not overridden("_softmax")
            with batch_invariant(ops="softmax"):
                assert active_ops() == {"softmax"} and overridden("_softmax") and not overridden("mm")
            assert active_ops() == {"matmul"} and overridden("mm") and not overridden("_softmax")
        assert state() == outer
    assert state() == before


def test_restores_on_exception():
    before = state()
    with pytest.raises(RuntimeError, match="boom"):
        with batch_invariant():
            with batch_invariant(ops={"norm"}):
                raise RuntimeError("boom")
    assert state() == before


def test_unknown_op_class_is_a_value_error():
    with pytest.raises(ValueError, match="unknown op class"):
        with batch_invariant(ops={"matmul", "conv"}):
            pass
    assert active_ops() == frozenset()


def tiny_qwen3(dtype=torch.bfloat16, hidden=256, layers=2):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(dtype).eval()
    model.set_attn_implementation("sdpa")
    return model


def test_model_attention_switched_and_restored():
    model = tiny_qwen3(layers=1)
    with pytest.raises(RuntimeError):
        with batch_invariant(model=model):
            assert model.config._attn_implementation == ATTN_IMPLEMENTATION
            with batch_invariant(ops={"matmul"}):
                # model still points at our function, which defers to SDPA while attention is off
                ids = torch.randint(0, 512, (2, 5))
                with torch.no_grad():
                    assert torch.isfinite(model(ids).logits).all()
            raise RuntimeError("body failed")
    assert model.config._attn_implementation == "sdpa"
    with batch_invariant(ops={"matmul"}, model=model):
        assert model.config._attn_implementation == "sdpa"  # attention not asked for: untouched


def test_mode_logits_close_to_default():
    model = tiny_qwen3(torch.float32, layers=1)
    ids = torch.randint(0, 512, (3, 11))
    with torch.no_grad():
        default = model(ids).logits
        with batch_invariant(model=model):
            ours = model(ids).logits
    assert ((ours - default).norm() / default.norm()).item() < 1e-5


def generate(model, ids, mask, new_tokens, fix=True):
    """Greedy generate with the mode (fix) or with the default kernels (its control)."""
    with mode(model=model) if fix else contextlib.nullcontext(), torch.no_grad():
        return model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, output_logits=True, return_dict_in_generate=True,
                              pad_token_id=0, eos_token_id=None)


def target_row(model, prompt, batch, fix=True):
    """(tokens, logits of every step) of the prompt's row in the middle of batch - 1 fillers, 32 steps."""
    fillers = torch.randint(0, 512, (batch - 1, 12), generator=torch.Generator().manual_seed(batch))
    at = batch // 2
    ids = torch.cat([fillers[:at], prompt, fillers[at:]])
    out = generate(model, ids, torch.ones_like(ids), 32, fix)
    return out.sequences[at], torch.stack([step[at] for step in out.logits])


def test_qwen3_generate_batch_invariant_with_mode():
    """Target row at batch sizes 1..8 (in the middle of the batch): identical tokens and
    identical logits at every step, with a KV cache (DynamicCache, decode q_len 1). fp32: the
    host's fp32 GEMMs differ between one row and several (its bf16 ones do not, on AVX512 Xeons)."""
    model = tiny_qwen3(torch.float32)
    prompt = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(5))
    require_variance(target_row(model, prompt, 1, fix=False), target_row(model, prompt, 8, fix=False),
                     "a tiny fp32 Qwen3's target row at batch 1 vs 8 (32 steps)")
    results = {batch: target_row(model, prompt, batch) for batch in range(1, 9)}
    tokens1, logits1 = results[1]
    assert logits1.shape[0] == 32
    for batch, (tokens, logits) in results.items():
        assert torch.equal(tokens, tokens1), batch
        assert torch.equal(logits, logits1), batch


def left_padded_and_alone(model, fix=True):
    """The target behind 5 padding positions among longer fillers, and alone: (tokens, logits) of each."""
    prompt = torch.randint(1, 512, (1, 12), generator=torch.Generator().manual_seed(6))
    solo = generate(model, prompt, torch.ones_like(prompt), 16, fix)
    ids = torch.randint(1, 512, (3, 17), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    ids[1, :5], mask[1, :5] = 0, 0
    ids[1, 5:] = prompt[0]
    padded = generate(model, ids, mask, 16, fix)
    return ((padded.sequences[1, 17:], [step[1] for step in padded.logits]),
            (solo.sequences[0, 12:], [step[0] for step in solo.logits]))


def test_qwen3_left_padding_invariant_with_mode():
    """The target behind 5 padding positions, among longer fillers, equals the target alone."""
    model = tiny_qwen3(torch.float32)
    require_variance(*left_padded_and_alone(model, fix=False), "a tiny fp32 Qwen3's target left-padded vs alone")
    padded, alone = left_padded_and_alone(model)
    assert torch.equal(padded[0], alone[0])
    assert all(torch.equal(a, b) for a, b in zip(padded[1], alone[1]))


def test_under_inference_mode_the_census_sees_linears_decomposed_and_the_rows_are_invariant():
    """torch.inference_mode turns autograd off, so aten::linear reached the census's dispatch mode whole
    and the mode refused a plain Qwen3 ("aten::linear is not covered"). The census now records the
    composite's parts as the backend runs them (addmm / mm, which the mode overrides): entered with
    model= inside inference_mode, the mode takes its census and runs. That those parts are the mode's
    is proved by the rows: with the row-count kernels on the CPU key (the control: a row alone and in a
    batch of 4 differ), the mode gives row 0 the same logits inside inference_mode. (The census itself
    runs without the row-count kernels: its check against the default forward is for real kernels.)"""
    from controls import row_count_kernels, same

    model = tiny_qwen3(torch.float32, hidden=128, layers=1)
    batch = torch.randint(0, 512, (4, 3), generator=torch.Generator().manual_seed(3))  # 3 rows vs 12
    with torch.inference_mode():
        with mode(model=model):  # raised UnsupportedModel before
            model(batch)
        with row_count_kernels():
            require_variance(model(batch[:1]).logits[0], model(batch).logits[0], "a tiny Qwen3's row 0 alone vs in 4")
            with mode():
                alone, among = model(batch[:1]).logits[0], model(batch).logits[0]
    assert same(alone, among)
