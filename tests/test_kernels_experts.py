"""The mode's MoE classes: invariant experts (transformers' ExpertsInterface), the router's top-k
ties, and the model's experts implementation restored exactly (nesting, exceptions)."""

import pytest
import torch

import family_models as fm
from controls import mode, require_variance
from nondet.kernels import batch_invariant, experts, router


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return fm.save_family("qwen3-moe", tmp_path_factory.mktemp("qwen3-moe"))


def _experts_module(model):
    return model.model.layers[0].mlp.experts


def _routing(n_tokens, num_experts=8, k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(num_experts, generator=g)[:k] for _ in range(n_tokens)])
    weights = torch.rand(n_tokens, k, generator=g)
    return index, weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_token_gets_the_same_bits_alone_and_among_many(moe_dir, dtype):
    """Token 0 alone (every expert gets M = 0 or 1) vs among 37 tokens (M up to ~20 per expert). The control:
    transformers' own experts (grouped_mm) give token 0 other bits on the same inputs; where they do not (bf16
    on the 2-core EPYC with AVX512-BF16), the case proves nothing on this host and is skipped (controls.py)."""
    module = _experts_module(fm.load(moe_dir, dtype))
    x = torch.randn(37, fm.HIDDEN, dtype=dtype)
    index, weights = _routing(37)
    with torch.no_grad():
        default_alone = module(x[:1], index[:1], weights[:1].to(dtype))
        default_many = module(x, index, weights.to(dtype))
    require_variance(default_alone[0], default_many[0], f"transformers' experts, token 0 in {dtype}")
    with mode(ops={"experts"}):
        alone = experts.experts_forward(module, x[:1], index[:1], weights[:1].to(dtype))
        many = experts.experts_forward(module, x, index, weights.to(dtype))
    assert torch.equal(alone[0], many[0])


def test_the_invariant_experts_compute_what_transformers_computes(moe_dir):
    module = _experts_module(fm.load(moe_dir, torch.float32))
    x = torch.randn(37, fm.HIDDEN)
    index, weights = _routing(37)
    eager = type(module).forward.__wrapped__(module, x, index, weights)  # transformers' own loop
    with batch_invariant(ops={"experts"}):
        ours = experts.experts_forward(module, x, index, weights)
    assert ((ours - eager).norm() / eager.norm()).item() < 1e-6


def test_the_experts_class_selects_and_restores_the_implementation(moe_dir):
    model = fm.load(moe_dir, torch.float32)
    before = _experts_module(model).config._experts_implementation
    with pytest.raises(RuntimeError, match="boom"):
        with batch_invariant(model=model):
            assert _experts_module(model).config._experts_implementation == experts.EXPERTS_IMPLEMENTATION
            with batch_invariant(ops={"matmul"}, model=model):  # an ablation without experts: fallback
                ids = fm.prompts()
                with torch.no_grad():
                    model(ids)
            raise RuntimeError("boom")
    assert _experts_module(model).config._experts_implementation == before
    assert not any("forward" in m.__dict__ for m in router.routers(model)), "a router stayed wrapped"


def test_topk_breaks_ties_by_lowest_index_under_the_router_class():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    with batch_invariant(ops={"router"}):
        values, indices = torch.topk(x, 2)
        assert indices.tolist() == [[1, 2], [0, 1]] and values.tolist() == [[3.0, 3.0], [2.0, 2.0]]
        low_values, low_indices = torch.topk(x, 2, largest=False)
        assert low_indices.tolist() == [[3, 0], [0, 1]]
    # the same row alone and in a batch: one answer
    with batch_invariant(ops={"router"}):
        assert torch.equal(torch.topk(x[1:], 3)[1][0], torch.topk(x, 3)[1][1])


def test_router_alone_makes_the_router_forward_invariant_and_nothing_else(moe_dir, monkeypatch):
    """ops={"router"}: inside a router's forward the matmul, softmax and norm (its top-k weight sum) classes
    are on; outside, off."""
    from nondet.kernels import active_ops

    model = fm.load(moe_dir, torch.float32)
    seen = {}
    gate_class = type(model.model.layers[0].mlp.gate)
    original = gate_class.forward

    def recording(self, *args, **kwargs):
        seen["router"] = active_ops()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(gate_class, "forward", recording)
    model.model.layers[0].mlp.experts.register_forward_pre_hook(lambda m, a: seen.update(experts=active_ops()))
    with batch_invariant(ops={"router"}, model=model), torch.no_grad():
        model(fm.prompts())
    assert seen["experts"] == {"router"}
    assert seen["router"] == {"router", "matmul", "softmax", "norm"}
