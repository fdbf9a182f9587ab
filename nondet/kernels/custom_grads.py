"""Backward formulas of the nondet:: custom ops, so a compiled training forward keeps the mode.

A trainer's teacher-forced forward must give the sampler's bits (on-policy RL); its backward may use
any kernels. In eager the aten overrides leave a backward to the original kernels (overrides.py) and
attention recomputes plain fp32 attention (autograd.py). Under torch.compile the forward's reductions
are nondet:: custom ops (custom_ops.py), which autograd cannot differentiate by itself: these are their
backward formulas, written with aten ops (torch.ops.aten.*, which no TorchFunctionMode sees), so the
backward is ordinary math that Inductor compiles as it likes, never our invariant kernels.
"""

import torch

aten = torch.ops.aten


def register(ops: dict) -> None:
    """Attach a backward to each custom op in `ops` (name -> CustomOpDef; `_gpu` variants share
    their base op's formula)."""
    for name, op in ops.items():
        setup, backward = FORMULAS[name.removesuffix("_gpu")]
        op.register_autograd(backward, setup_context=setup)


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2)


# -- matmuls --------------------------------------------------------------------------------


def _save_ab(ctx, inputs, output):
    a, b = inputs[-2], inputs[-1]  # (a, b) or (bias, a, b)
    ctx.save_for_backward(a, b)
    ctx.bias_shape = inputs[0].shape if len(inputs) == 3 else None


def _mm_grads(ctx, g, mul):
    a, b = ctx.saved_tensors
    ga = mul(g, _t(b)).to(a.dtype) if ctx.needs_input_grad[-2] else None
    # b is usually a weight's transpose (F.linear: x @ W.t()): computed as (g^T a)^T, its gradient is
    # W's layout once autograd transposes it back, so accumulating W.grad copies nothing (as a^T g
    # did: a transposed copy of every weight gradient, 2 ms of an H100 trainer step).
    gb = _t(mul(_t(g), a)).to(b.dtype) if ctx.needs_input_grad[-1] else None
    return ga, gb


def _mm_backward(ctx, g):
    return _mm_grads(ctx, g, aten.mm.default)


def _addmm_backward(ctx, g):
    ga, gb = _mm_grads(ctx, g, aten.mm.default)
    gbias = g.sum_to_size(ctx.bias_shape) if ctx.needs_input_grad[0] else None
    return gbias, ga, gb


def _bmm_backward(ctx, g):
    return _mm_grads(ctx, g, aten.bmm.default)


# -- row reductions ---------------------------------------------------------------------------


def _save_mean(ctx, inputs, output):
    x, keepdim = inputs
    ctx.shape, ctx.dtype, ctx.keepdim = x.shape, x.dtype, keepdim


def _mean_backward(ctx, g):
    g = g if ctx.keepdim else g.unsqueeze(-1)
    return (g / ctx.shape[-1]).expand(ctx.shape).to(ctx.dtype), None


def _save_mean_sq(ctx, inputs, output):
    x, keepdim = inputs
    ctx.save_for_backward(x)
    ctx.keepdim = keepdim


def _mean_sq_backward(ctx, g):
    # d mean(x^2) / dx = 2 x / n, for the fp32 upcast of x; back to x's dtype as the upcast's backward
    (x,) = ctx.saved_tensors
    g = g if ctx.keepdim else g.unsqueeze(-1)
    return (g * (2.0 / x.shape[-1]) * x.float()).to(x.dtype), None


def _save_softmax(ctx, inputs, output):
    x, log = inputs
    ctx.save_for_backward(output)
    ctx.log, ctx.dtype = log, x.dtype


def _softmax_backward(ctx, g):
    # torch's own fused backward kernels (what autograd runs for softmax / log_softmax): one pass over
    # a trainer's (tokens, vocab) logits instead of a chain of elementwise ops
    (y,) = ctx.saved_tensors
    backward = aten._log_softmax_backward_data if ctx.log else aten._softmax_backward_data
    return backward.default(g.to(y.dtype), y, -1, ctx.dtype), None


def _save_layer_norm(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps, ctx.has_bias = eps, bias is not None
    ctx.bias_dtype = None if bias is None else bias.dtype


def _layer_norm_backward(ctx, g):
    x, weight = ctx.saved_tensors
    n = x.shape[-1]
    xf, gf = x.float(), g.float()
    mu = aten.mean.dim(xf, [-1], True)
    rstd = torch.rsqrt(aten.mean.dim((xf - mu) * (xf - mu), [-1], True) + ctx.eps)
    xhat = (xf - mu) * rstd
    gxhat = gf if weight is None else gf * weight.float()
    gx = rstd * (gxhat - aten.mean.dim(gxhat, [-1], True) - xhat * aten.mean.dim(gxhat * xhat, [-1], True))
    gw = None
    if weight is not None and ctx.needs_input_grad[1]:
        gw = aten.sum.dim_IntList((gf * xhat).reshape(-1, n), [0]).to(weight.dtype)
    gb = aten.sum.dim_IntList(gf.reshape(-1, n), [0]).to(ctx.bias_dtype) if ctx.has_bias else None
    return gx.to(x.dtype), gw, gb, None


# -- attention --------------------------------------------------------------------------------


def _save_attention(ctx, inputs, output):
    q, k, v, mask, scale, is_causal, softcap, sinks, sliding = inputs
    ctx.save_for_backward(q, k, v, mask, sinks)
    ctx.scale, ctx.is_causal, ctx.softcap = scale, is_causal, softcap


def _attention_backward(ctx, g):
    """The vector-Jacobian product of plain fp32 attention (autograd.plain_attention), as eager's."""
    from nondet.kernels.autograd import plain_attention

    q, k, v, mask, sinks = ctx.saved_tensors

    def forward(q, k, v, *sink):
        return plain_attention(q, k, v, mask, ctx.scale, ctx.is_causal, ctx.softcap, *sink)

    primals = (q, k, v) if sinks is None else (q, k, v, sinks)
    with torch._C.DisableTorchFunction():  # plain math: never the mode's routing
        _, vjp = torch.func.vjp(forward, *primals)
        grads = vjp(g.to(q.dtype))
    gq, gk, gv = grads[:3]
    return gq, gk, gv, None, None, None, None, (grads[3] if sinks is not None else None), None


FORMULAS = {
    "mm": (_save_ab, _mm_backward),
    "addmm": (_save_ab, _addmm_backward),
    "bmm": (_save_ab, _bmm_backward),
    "mean_last": (_save_mean, _mean_backward),
    "mean_sq": (_save_mean_sq, _mean_sq_backward),
    "softmax": (_save_softmax, _softmax_backward),
    "layer_norm": (_save_layer_norm, _layer_norm_backward),
    "attention": (_save_attention, _attention_backward),
}
