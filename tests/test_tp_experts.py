"""--tp-invariant on a fused MoE (kernels/tp_experts.py): the experts' down projection reduces its K
(the intermediate dim) as tp_tree's fixed tree, or the run is refused in one line.

Structural, on any host: what a rank computes at TP2 (its half of the intermediate dim as a 2-leaf
subtree, then the collective's pairwise add) equals the 4-leaf tree of TP1, bit for bit, while the
experts without the tree give other bits (the control). End to end (slow): probe --tp 1,2 on a tiny
Qwen3-MoE, where the mode alone leaves TP2 off TP1 and --tp-invariant makes them bitwise equal.
"""

import json
import os

import pytest
import torch

import cli_runner
import family_models as fm
from controls import FIX_KERNELS, mode
from nondet.kernels import batch_invariant, tp_experts, tp_tree
from nondet.probes.models.default_model import build_tokenizer


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return fm.save_family("qwen3-moe", tmp_path_factory.mktemp("qwen3-moe"), tokenizer=build_tokenizer(512))


def _routed(experts, tokens: int = 5):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, experts.gate_up_proj.shape[-1], generator=gen).bfloat16()
    index = torch.stack([torch.randperm(experts.num_experts, generator=gen)[:2] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, 2, generator=gen), -1).bfloat16()
    return hidden, index, weights


def _experts_tree(module, routed, leaves: int) -> torch.Tensor:
    tp_experts.set_leaves(leaves)
    try:
        return module(*routed)
    finally:
        tp_experts.set_leaves(0)


def test_a_ranks_subtree_of_the_experts_then_the_pairwise_add_is_the_whole_tree(moe_dir):
    model = fm.load(moe_dir, torch.bfloat16)
    experts = model.model.layers[0].mlp.experts
    routed = _routed(experts)
    with torch.no_grad(), mode(model=model):
        whole = _experts_tree(experts, routed, 4)
        plain = experts(*routed)
        # rank r at TP2 holds [gate_r; up_r] and down_proj's columns r: a view of half the intermediate dim
        ranks = [_rank_subtree(tp_experts.LeafView(experts, r, 2), routed) for r in (0, 1)]
    assert not torch.equal(plain, whole)  # control: the tree is not what the experts compute alone
    # but the same sum up to bf16 roundings: the leaves partition the intermediate dim
    assert (whole.float() - plain.float()).norm() < 0.02 * plain.float().norm()
    assert torch.equal(tp_tree.pairwise_tree(ranks), whole)


def _rank_subtree(view, routed) -> torch.Tensor:
    """A TP2 rank's partial: its 2 leaves of the experts (on its half) as a pairwise tree."""
    from nondet.kernels import experts

    tp_experts.set_leaves(2)
    try:
        return tp_experts.tree_combine(view, *routed, experts._invariant_combine)
    finally:
        tp_experts.set_leaves(0)


def test_tree_combine_splits_only_into_equal_chunks(moe_dir):
    model = fm.load(moe_dir, torch.float32)
    experts = model.model.layers[0].mlp.experts  # intermediate 32
    with torch.no_grad(), batch_invariant(model=model), pytest.raises(ValueError, match="into 3 equal chunks"):
        _experts_tree(experts, _routed(experts), 3)


def test_tree_linears_hooks_the_experts_and_refuses_a_layout_it_does_not_cover(moe_dir):
    model = fm.load(moe_dir, torch.float32)
    with tp_tree.tree_linears(model, 2) as names:
        assert "model.layers.0.mlp.experts" in names and "model.layers.0.self_attn.o_proj" in names
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
    model.model.layers[1].mlp.experts.is_transposed = True
    with pytest.raises(ValueError) as info:
        with tp_tree.tree_linears(model, 2):
            pass
    message = str(info.value)
    assert "\n" not in message
    assert message == ("--tp-invariant does not cover model.layers.1.mlp.experts.down_proj, which the tensor-parallel "
                       "plan shards row-wise: its experts layout has is_transposed=True")


def test_the_experts_leaves_are_made_once_per_module_with_the_bits_of_leaves_made_per_call(moe_dir, monkeypatch):
    """TP1 under a tree of 2: each experts module's leaf weights are copied once and held (a later scope reuses
    them; a write to a projection gets new ones), not at every call; the control makes them at every call (the
    path before) and gives the same logits. A rank of one leaf copies nothing."""
    model = fm.load(moe_dir, torch.bfloat16)
    layers = len(model.model.layers)
    ids = torch.tensor([[5, 9, 2, 7, 11]])
    made, real, held_leaves = [], tp_experts.leaf_weights, tp_experts.held_leaves
    monkeypatch.setattr(tp_experts, "leaf_weights", lambda m, i, c: made.append((i, c)) or real(m, i, c))

    def logits_of_three_forwards(leaves: int = 2):
        made.clear()
        with torch.no_grad(), mode(model=model), tp_tree.tree_linears(model, leaves):
            return [model(ids).logits for _ in range(3)]

    once = logits_of_three_forwards()
    assert len(made) == 2 * layers  # two leaves per experts module, at the scope's start
    assert all(torch.equal(a, b) for a, b in zip(once, logits_of_three_forwards())) and made == []  # held
    with torch.no_grad():
        model.model.layers[0].mlp.experts.gate_up_proj.mul_(1.0)  # an in-place write: that module's leaves again
    logits_of_three_forwards()
    assert made == [(0, 2), (1, 2)]
    monkeypatch.setattr(tp_experts, "held_leaves", lambda module, count: [None] * count)  # none held
    per_call = logits_of_three_forwards()
    assert len(made) == 3 * 2 * layers  # the control: made again at every call
    assert all(torch.equal(a, b) for a, b in zip(once, per_call))
    shares = [w for leaves in tp_experts._HELD.values() for leaf in leaves[1] for w in leaf.values()]
    assert shares and all(isinstance(w, torch.nn.Parameter) for w in shares)  # dynamo's static inputs
    experts = model.model.layers[0].mlp.experts
    one = held_leaves(experts, 1)[0]  # a rank of one leaf: the module's own storage
    assert one["down_proj"].data_ptr() == experts.down_proj.data_ptr()
    assert one["gate_up_proj"].data_ptr() == experts.gate_up_proj.data_ptr()


@pytest.mark.slow
def test_on_an_moe_the_mode_alone_leaves_tp2_off_tp1_and_the_tree_makes_them_bitwise_equal(tmp_path, moe_dir):
    """bf16, as models are served: each rank's partial is rounded to bf16 before the all-reduce, so without
    the tree TP2 leaves TP1 from the first step. In fp32 the control did not fire on a 2-core AMD EPYC
    (AVX2, 2026-11-28): the halves' sums move only the last bits of this tiny random model's logits (|x| <
    0.6, an ulp ~6e-8), less than a logprob's ulp at -5.7 (~5e-7), so no logprob bit moved."""
    def versus(*extra):
        out = tmp_path / ("tree" if extra else "plain")
        r = cli_runner.run(("probe", "--tp", "1,2", "--model", str(moe_dir), "--prompt", "Tell me about Richard Feynman",
                            "--batch-sizes", "1,2", "--max-new-tokens", "6", "--kernels", FIX_KERNELS,
                            "--dtype", "bfloat16", "--out", str(out), *extra), env=dict(os.environ), timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        summary = json.loads((out / "summary.json").read_text())
        (row,) = summary["tensor_parallel"]["modes"][FIX_KERNELS]["vs_reference"]
        return row

    plain = versus()
    assert not plain["bitwise_equal"] and plain["first_numeric_divergence"] is not None  # positive control
    tree = versus("--tp-invariant")
    assert tree["bitwise_equal"] and tree["first_numeric_divergence"] is None  # negative control
