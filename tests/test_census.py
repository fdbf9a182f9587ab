"""The op census (nondet/kernels/census.py): what the mode covers is found by running the model.

Positive controls: a model with an op the mode does not cover is refused, naming the module and the op;
a mode whose kernel computes something else is refused for its logits. Negative controls: a covered
model passes with no uncovered op and logits within rounding.
"""

import pytest
import torch
import transformers as tf

from nondet.kernels import batch_invariant, census, ops
from nondet.kernels.mode import census_of
from nondet.kernels.coverage import UnsupportedModel

SMALL = dict(vocab_size=128, hidden_size=32, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64)


def _model(config):
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(config).eval()


def _qwen3():
    return _model(tf.Qwen3Config(**SMALL, num_hidden_layers=1, num_key_value_heads=2, head_dim=8))


def _qwen3_next():
    return _model(tf.Qwen3NextConfig(**SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=8,
                                     num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                     linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                                     linear_value_head_dim=8))


def test_a_covered_model_has_no_uncovered_op_and_agrees_with_the_default():
    with census.cleared():
        found = census_of(_qwen3())
    counts = found.counts()
    assert counts["uncovered"] == 0
    assert counts["routed"] > 0 and counts["row-independent"] > 0
    ops_routed = {u.op for u in found.uses if u.verdict == "routed" and u.why.startswith("aten override")}
    assert {"aten::mm", "aten::mean"} <= ops_routed  # linears and RMSNorm, through the overrides
    assert found.agrees() and found.max_logit_diff <= found.tolerance


def test_an_uncovered_op_refuses_naming_module_and_op():
    model = _qwen3_next()
    with census.cleared(), pytest.raises(UnsupportedModel) as refused:
        with batch_invariant(model=model):
            pass
    message = str(refused.value)
    assert "linear_attn: aten::" in message and "is not covered by the batch-invariant mode" in message
    assert "\n" not in message


def test_allow_uncovered_runs_and_lists_what_was_not_covered():
    model = _qwen3_next()
    with census.cleared():
        with batch_invariant(model=model, allow_uncovered=True):
            pass
        found = census_of(model)
    missing = {u.op for u in found.uncovered()}
    assert "aten::cumsum" in missing  # the gated delta rule's chunked form
    assert all(entry.split(": ")[1] in missing for entry in found.to_json()["uncovered"])


def test_a_kernel_that_computes_something_else_is_refused_for_its_logits(monkeypatch):
    model = _qwen3()
    real_mean = ops.mean_last
    monkeypatch.setattr(ops, "mean_last", lambda x, keepdim=False, dtype=None: real_mean(x, keepdim, dtype) * 4)
    with census.cleared(), pytest.raises(UnsupportedModel, match="changes Qwen3ForCausalLM's logits by up to"):
        with batch_invariant(model=model):
            pass


def test_compiled_census_counts_an_aten_override_as_uncovered():
    """Under torch.compile an aten override is not called: only nondet:: ops are covered there."""
    mm = torch.ops.aten.mm.default
    a = torch.randn(3, 4)
    assert census.classify(mm, (a, a.t()), {}, compiled=False, in_kernel=False)[0] == census.ROUTED
    assert census.classify(mm, (a, a.t()), {}, compiled=True, in_kernel=False)[0] == census.UNCOVERED


def test_a_direct_sdpa_call_is_routed_to_the_invariant_attention():
    """Falcon calls F.scaled_dot_product_attention itself: the mode routes it (sdpa.py)."""
    model = _model(tf.FalconConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=4))
    with census.cleared():
        found = census_of(model)
    assert found.uncovered() == []
    attention = [u for u in found.uses if u.module.endswith("self_attention") and u.verdict == "routed"]
    assert any(u.why == "inside a nondet kernel" for u in attention)


def test_an_accumulating_scatter_is_not_row_independent():
    from nondet.kernels import op_kinds

    x, idx, v = torch.zeros(4), torch.tensor([0, 0]), torch.ones(2)
    put = torch.ops.aten.index_put.default
    assert op_kinds.row_independent(put, (x, [idx], v, False), {}) == "indexing"
    assert op_kinds.row_independent(put, (x, [idx], v, True), {}) is None
    assert op_kinds.row_independent(torch.ops.aten.cumsum.default, (x, 0), {}) is None
    assert op_kinds.row_independent(torch.ops.aten.cumsum.default, (idx, 0), {}) == "integer arithmetic"


def test_a_collective_sum_outside_the_modes_all_reduce_is_uncovered_a_copy_is_not():
    import torch.distributed  # noqa: F401 - registers the _c10d_functional ops

    funcol = torch.ops._c10d_functional
    linear, embedding = torch.nn.Linear(2, 2), torch.nn.Embedding(4, 2)
    assert census.classify(funcol.all_reduce.default, (), {}, False, False, linear)[0] == census.UNCOVERED
    assert census.classify(funcol.all_reduce.default, (), {}, False, True, linear)[0] == census.ROUTED  # ours
    assert census.classify(funcol.all_reduce.default, (), {}, False, False, embedding)[0] == census.ROW_INDEPENDENT
    assert census.classify(funcol.all_gather_into_tensor.default, (), {}, False, False, linear)[0] == \
        census.ROW_INDEPENDENT


def test_a_bf16_add_with_alpha_on_a_cpu_is_not_row_independent():
    """add / sub with alpha != 1 in bf16 round by position on AVX-512 and AVX2 (the vector body fuses
    the multiply-add; tests/test_elementwise_position.py measures it) and the mode has no kernel for
    them: the census must not wave them through. alpha = 1, or fp32, stays row-independent."""
    from nondet.kernels import op_kinds

    add, sub = torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor
    x = torch.randn(4, dtype=torch.bfloat16)
    assert op_kinds.row_independent(add, (x, x), {"alpha": 1.3}) is None
    assert op_kinds.row_independent(sub, (x, x), {"alpha": 2}) is None
    assert census.classify(add, (x, x), {"alpha": 1.3}, False, False)[0] == census.UNCOVERED
    assert op_kinds.row_independent(add, (x, x), {}) == "elementwise"
    assert op_kinds.row_independent(add, (x.float(), x.float()), {"alpha": 1.3}) == "elementwise"
