"""The mode under Inductor on CUDA: the compiled graph launches the matmul and row-reduction Triton
kernels itself (the `_gpu` triton_ops, no Python call into a custom op per launch), and its bits
equal the eager mode's, alone and in a batch."""

import re

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

from nondet.kernels import batch_invariant  # noqa: E402


@pytest.fixture(scope="module")
def qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).to("cuda", torch.bfloat16).eval()


def _ids(batch: int, length: int = 40):
    return torch.randint(3, 512, (batch, length), device="cuda", generator=torch.Generator("cuda").manual_seed(5))


def _launched(source: str) -> set:
    """Our Triton kernels that Inductor's generated code launches (it names them `<kernel>_<n>`)."""
    return set(re.findall(r"\b(_mm_tma_kernel|_mm_kernel|_mean_kernel|_mean_sq_kernel)_\d+\b", source))


def test_inductor_launches_the_kernels_itself_and_keeps_the_eager_modes_bits(qwen3):
    from torch._inductor.utils import run_and_get_code

    ids = _ids(4)
    torch._dynamo.reset()
    compiled = torch.compile(qwen3.forward, dynamic=False)
    with torch.no_grad(), batch_invariant(model=qwen3, traceable=True):
        eager = qwen3(ids, use_cache=False).logits
        out, code = run_and_get_code(compiled, ids, use_cache=False)
        alone = compiled(ids[:1], use_cache=False).logits
    source = "\n".join(code)
    launched = _launched(source)
    # the norms' means read their bf16 inputs (squares.py): the eager mode's pow + _mean_kernel bits
    assert "_mean_sq_kernel" in launched and launched & {"_mm_kernel", "_mm_tma_kernel"}, launched
    # no per-op Python call left for them; attention stays the opaque custom op (custom_ops.GPU_OPS)
    assert "nondet.mm" not in source and "nondet.mean" not in source and "nondet.attention" in source
    assert torch.equal(out.logits, eager)
    assert torch.equal(alone[0], out.logits[0])


def test_compiled_static_cache_decode_equals_the_eager_mode(qwen3):
    ids = _ids(1, 16)
    torch._dynamo.reset()
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                  output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad(), batch_invariant(model=qwen3, traceable=True):
        eager = qwen3.generate(ids, disable_compile=True, **kwargs).logits
        compiled = qwen3.generate(ids, cache_implementation="static", **kwargs).logits
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))


def test_a_compiled_training_forward_keeps_the_eager_modes_bits(qwen3):
    """With gradients on (a trainer's teacher-forced forward), Inductor's graph keeps the mode: the
    logits equal the eager mode's, row 0 alone equals row 0 in a batch of 4, and the backward runs."""
    ids = _ids(4)
    qwen3.train()
    try:
        torch._dynamo.reset()
        compiled = torch.compile(qwen3.forward, dynamic=False)
        with batch_invariant(model=qwen3, traceable=True):
            eager = qwen3(ids, use_cache=False).logits.detach()
            out = compiled(ids, use_cache=False).logits
            out.float().log_softmax(-1).mean().backward()
            alone = compiled(ids[:1], use_cache=False).logits.detach()
        grads = [p.grad for p in qwen3.parameters() if p.grad is not None]
        assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
        assert torch.equal(out.detach(), eager)
        assert torch.equal(alone[0], out.detach()[0])
    finally:
        qwen3.zero_grad(set_to_none=True)
        qwen3.eval()



def _eager_matmul_kernel(fn) -> str:
    """The name of the one matmul kernel that fn launches in eager."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = {event.name for event in prof.events() if event.name in ("_mm_kernel", "_mm_tma_kernel")}
    assert len(names) == 1, names
    return names.pop()


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("n", [4096, 1024])
def test_a_compiled_prefill_linear_launches_the_eager_kernel_with_its_bits(n, mode):
    """A 512-token prefill's linear (K=4096) compiled under the mode, by Inductor and as a CUDA graph
    (reduce-overhead), launches the kernel the eager dispatch launches (the persistent TMA kernel,
    its descriptors built in the kernel, or split K where the tiles are too few) with the eager bits."""
    import torch.nn.functional as F
    from torch._inductor.utils import run_and_get_code

    gen = torch.Generator("cuda").manual_seed(9)
    x = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, 4096, device="cuda", dtype=torch.bfloat16, generator=gen)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: F.linear(a, b), mode=mode, dynamic=False)
    with torch.no_grad(), batch_invariant(ops="matmul", traceable=True):
        eager = F.linear(x, w)
        kernel = _eager_matmul_kernel(lambda: F.linear(x, w))
        out, code = run_and_get_code(compiled, x, w)
        outs = [out.clone()] + [compiled(x, w).clone() for _ in range(3)]  # CUDA graphs: recorded, replayed
    source = "\n".join(code)
    if n == 4096:  # 4 x 32 tiles of 128 x 128: the persistent kernel, not split K
        assert kernel == "_mm_tma_kernel"
    assert _launched(source) == {kernel}
    assert "nondet.mm" not in source  # launched from Inductor's code, not through the opaque op
    assert all(torch.equal(o, eager) for o in outs)


def test_the_modes_decode_step_is_saved_on_cuda(tmp_path, monkeypatch):
    """`probe --compile` under the mode on CUDA keeps a saved step (not transformers' JIT compile): on an H200
    with torch 2.11 its trace with the key length symbolic failed in Inductor (an int32 running max, then
    "name 'buf0' is not defined", then "CantSplit"), and the mode fell back to the JIT compile, 3 graphs and
    30-60 s of warm-up in every process. Traced again with the length fixed where the symbolic trace fails
    (precompiled.py), it is saved, and a second probe loads it; the default kernels' step too. Passed on an
    H200 (2026-11-29, 75 s), the function for every batch saved with the length symbolic."""
    from model_fixtures import save_qwen3

    from nondet.probes.core import precompiled
    from nondet.probes.models.default_model import build_tokenizer
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe

    model = save_qwen3(tmp_path / "m", build_tokenizer(512), hidden=256, layers=2, heads=4, kv_heads=2, seed=1)
    monkeypatch.setenv("NONDET_CACHE", str(tmp_path / "cache"))
    steps = []
    for run in ("cold", "warm"):
        config = ProbeConfig(prompt="Tell me about Richard Feynman", batch_sizes=(1, 2, 4), max_new_tokens=6,
                             model=ModelSpec(name=str(model), device="cuda"), compile_backend="inductor",
                             kernels=("default", "batch-invariant"), out=str(tmp_path / run))
        steps.append(run_probe(config).summary["decode_path"]["precompiled"])
    for mode in ("default", "batch-invariant"):
        cold, warm = steps[0][mode], steps[1][mode]
        assert not any(what.startswith("JIT compile") for what in cold.values()), cold
        assert all(what.startswith("loaded") for what in warm.values()), warm
    assert precompiled.EVERY_BATCH in steps[0]["batch-invariant"]
