"""The invariant experts on CUDA without a host sync (grouped.py): the loop's bits at a realistic width,
no sync (CUDA's sync debug mode raises on one), captured and replayed as a CUDA graph, and a compiled
MoE decode under CUDA graphs that equals the eager mode."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

from nondet.kernels import batch_invariant, experts, grouped  # noqa: E402


@pytest.fixture(scope="module")
def a3b_experts():
    """One Qwen3-30B-A3B-shaped experts module: 128 experts, hidden 2048, width 768, bf16."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8)
    torch.manual_seed(0)
    module = Qwen3MoeExperts(cfg).to("cuda", torch.bfloat16)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.02)
    return module


def _routing(tokens: int, seed: int = 0):
    g = torch.Generator("cuda").manual_seed(seed)
    scores = torch.rand(tokens, 128, device="cuda", generator=g)
    weights, index = scores.topk(8)
    return index, (weights / weights.sum(-1, keepdim=True)).to(torch.bfloat16)


@pytest.mark.parametrize("tokens", [1, 7, 64, 512, 1024])  # 1024: 64-row tiles (triton_grouped.tiles)
def test_the_grouped_experts_give_the_loops_bits_and_a_token_alone_its_bits_in_a_batch(a3b_experts, tokens):
    x = torch.randn(tokens, 2048, device="cuda", generator=torch.Generator("cuda").manual_seed(1)).to(torch.bfloat16)
    index, weights = _routing(tokens)
    with torch.no_grad(), batch_invariant(ops={"experts", "matmul"}):
        assert grouped.applies(x, a3b_experts)
        loop = experts._combine(a3b_experts, x, index, weights)
        ours = grouped.combine(a3b_experts, x, index, weights)
        alone = grouped.combine(a3b_experts, x[-1:], index[-1:], weights[-1:])
    assert torch.equal(ours, loop)
    assert torch.equal(alone[0], ours[-1])


def test_no_host_sync_and_a_cuda_graph_replays_it(a3b_experts):
    x = torch.randn(32, 2048, device="cuda", dtype=torch.bfloat16)
    index, weights = _routing(32, seed=2)
    with torch.no_grad(), batch_invariant(ops={"experts", "matmul"}):
        expected = grouped.combine(a3b_experts, x, index, weights)  # also compiles the kernel before the capture
        torch.cuda.set_sync_debug_mode("error")
        try:
            grouped.combine(a3b_experts, x, index, weights)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph):
            captured = grouped.combine(a3b_experts, x, index, weights)
        torch.cuda.current_stream().wait_stream(stream)
        other_index, other_weights = _routing(32, seed=3)
        index.copy_(other_index)  # new routing in the same buffers: the replay follows it
        weights.copy_(other_weights)
        graph.replay()
        torch.cuda.synchronize()
        fresh = grouped.combine(a3b_experts, x, index, weights)
    assert torch.equal(captured, fresh) and not torch.equal(fresh, expected)


def test_a_compiled_moe_decode_with_cuda_graphs_equals_the_eager_mode():
    """transformers' compiled generate (static cache, CUDA graphs) of a small Qwen3-MoE under the mode:
    the logits equal the eager mode's, at B = 1 and row 0 of B = 4."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                         num_experts=16, num_experts_per_tok=4, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, decoder_sparse_step=1, mlp_only_layers=[],
                         max_position_embeddings=256)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(3, 512, (4, 12), device="cuda", generator=torch.Generator("cuda").manual_seed(4))
    kwargs = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, output_logits=True,
                  return_dict_in_generate=True, pad_token_id=0)
    torch._dynamo.reset()
    with torch.no_grad(), batch_invariant(model=model, traceable="compiled_calls"):
        eager = model.generate(ids[:1], attention_mask=torch.ones_like(ids[:1]), disable_compile=True, **kwargs).logits
        compiled = model.generate(ids[:1], attention_mask=torch.ones_like(ids[:1]), cache_implementation="static",
                                  **kwargs).logits
        batch = model.generate(ids, attention_mask=torch.ones_like(ids), cache_implementation="static", **kwargs).logits
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled, strict=True))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(compiled, batch, strict=True))
