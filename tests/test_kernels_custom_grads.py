"""Backward formulas of the nondet:: custom ops (custom_grads.py): a compiled training forward under
the mode keeps the invariant ops in its graph, and its gradients are those of plain autograd.

Each op's gradient is checked against torch's own op on the same inputs (fp32, so the two differ
only by summation order); then a compiled training step on a small Qwen3 (aot_eager: fast on 2 cores)
against the eager mode's forward bits and the default kernels' gradients.
"""

import pytest
import torch
import torch.nn.functional as F

import family_models as fm
from nondet.kernels import batch_invariant, custom_ops
from nondet.kernels.autograd import plain_attention


def _grads(fn, *inputs):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    seed = torch.Generator().manual_seed(1)
    out.backward(torch.randn(out.shape, generator=seed))
    return [x.grad for x in leaves]


def _close(ours, ref):
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a is not None and a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", autouse=True)
def registered():
    custom_ops.ensure_registered()


nd = torch.ops.nondet


def test_matmul_grads():
    a, b, bias, bias2 = _rand(5, 8), _rand(8, 6, seed=1), _rand(6, seed=2), _rand(5, 6, seed=3)
    _close(_grads(nd.mm, a, b), _grads(torch.mm, a, b))
    _close(_grads(nd.addmm, bias, a, b), _grads(torch.addmm, bias, a, b))  # bias broadcast over rows
    _close(_grads(nd.addmm, bias2, a, b), _grads(torch.addmm, bias2, a, b))
    x, y = _rand(3, 5, 8, seed=4), _rand(3, 8, 6, seed=5)
    _close(_grads(nd.bmm, x, y), _grads(torch.bmm, x, y))


def test_row_reduction_grads():
    x = _rand(4, 3, 16)
    _close(_grads(lambda t: nd.mean_last(t, False), x), _grads(lambda t: t.mean(-1), x))
    _close(_grads(lambda t: nd.mean_last(t, True), x), _grads(lambda t: t.mean(-1, keepdim=True), x))
    _close(_grads(lambda t: nd.mean_sq(t, True), x), _grads(lambda t: t.float().pow(2).mean(-1, keepdim=True), x))
    _close(_grads(lambda t: nd.mean_sq(t, False), x), _grads(lambda t: t.pow(2).mean(-1), x))
    half = x.bfloat16()  # the gradient of the upcast: back in x's dtype
    _close(_grads(lambda t: nd.mean_sq(t, False), half), _grads(lambda t: t.float().pow(2).mean(-1), half))
    _close(_grads(lambda t: nd.softmax(t, False), x), _grads(lambda t: t.softmax(-1), x))
    _close(_grads(lambda t: nd.softmax(t, True), x), _grads(lambda t: t.log_softmax(-1), x))


def test_layer_norm_grads():
    x, w, b = _rand(6, 32), _rand(32, seed=1), _rand(32, seed=2)
    _close(_grads(lambda t, u, v: nd.layer_norm(t, u, v, 1e-5), x, w, b),
           _grads(lambda t, u, v: F.layer_norm(t, (32,), u, v, 1e-5), x, w, b))
    _close(_grads(lambda t: nd.layer_norm(t, None, None, 1e-5), x), _grads(lambda t: F.layer_norm(t, (32,)), x))


@pytest.mark.parametrize("softcap,with_sinks", [(None, False), (30.0, False), (None, True)])
def test_attention_grads(softcap, with_sinks):
    q, k, v = _rand(2, 4, 5, 8), _rand(2, 2, 7, 8, seed=1), _rand(2, 2, 7, 8, seed=2)  # GQA: 4 query / 2 KV heads
    sinks = _rand(4, seed=3) if with_sinks else None
    mask = torch.ones(1, 1, 5, 7, dtype=torch.bool).tril(2)  # (B, 1, Q, S), as transformers passes it
    inputs = (q, k, v) + ((sinks,) if with_sinks else ())

    def ours(q, k, v, *sink):
        return nd.attention(q, k, v, mask, 8 ** -0.5, True, softcap, sink[0] if sink else None, False)

    def ref(q, k, v, *sink):
        return plain_attention(q, k, v, mask, 8 ** -0.5, True, softcap, sink[0] if sink else None)

    _close(_grads(ours, *inputs), _grads(ref, *inputs))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    model = fm.load(fm.save_family("qwen3", tmp_path_factory.mktemp("qwen3")), torch.float32)
    model.train()
    return model


def _training_step(model, forward, scope):
    model.zero_grad()
    with scope():
        logits = forward(fm.prompts(), use_cache=False).logits
        logits.float().log_softmax(-1).mean().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_a_compiled_training_step_keeps_the_mode(qwen3):
    """With gradients on, the traced graph holds the nondet:: ops (before their backward formulas
    the mode stepped aside there and Inductor re-derived every reduction); the forward gives the eager
    mode's bits and the gradients are the default kernels' up to summation order."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    _training_step(qwen3, torch.compile(qwen3.forward, backend=record), lambda: batch_invariant(model=qwen3,
                                                                                                traceable=True))
    traced = {str(n.target).split(".default")[0] for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert {"nondet.mm", "nondet.mean_last", "nondet.attention"} <= traced, traced

    eager_logits, _ = _training_step(qwen3, qwen3.forward, lambda: batch_invariant(model=qwen3))
    _, default_grads = _training_step(qwen3, qwen3.forward, torch.enable_grad)
    torch._dynamo.reset()
    compiled = torch.compile(qwen3.forward, backend="aot_eager", dynamic=False)
    logits, grads = _training_step(qwen3, compiled, lambda: batch_invariant(model=qwen3, traceable=True))
    assert torch.equal(logits, eager_logits)
    assert grads.keys() == default_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, default_grads[name], rtol=1e-3, atol=1e-6, msg=name)
