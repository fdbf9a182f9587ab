"""A deliberately batch-variant RMSNorm: the positive control that fires on every machine.

Whether a host's own kernels are batch-variant depends on its BLAS, its CPU and its thread
count (on one CPU the embedded demo flips a token at step 93, on another only at step 266).
A check that the detector fires must not depend on that, so this module builds the variance
on purpose, the way a split reduction does: the model's own norm when a single row is computed
(its family's formula, Gemma's 1 + weight included), but with a sum of squares of CHUNKS bf16
partial sums added in order when several rows share the call (a strategy chosen by the number of
rows). A request decoding alone and the same request decoding beside others therefore get
different bits from their first decode step; prefill (many rows either way) is the same in both.

Under the batch-invariant mode's "norm" class it takes the one-row path for every batch,
as swapping in an invariant norm kernel would: so --confirm, bisect's ablation and the gate
see a fix that really works. The op census's reference (a request alone) takes it too
(one_row.py). Nothing here runs unless a caller installs it.
"""

import torch

from nondet.kernels.mode import is_active
from nondet.kernels.one_row import held as one_row_held

CHUNKS = 32  # partial sums of the split path, added one by one into a bf16 total


def make_batch_variant_norm(original):
    """A module that replaces `original` (an RMSNorm over the last dimension) and computes exactly
    what it computes for a lone row: its own forward, whatever the family's formula. Several rows
    take the split sum of squares, in the plain formula (weight * normalized, cast first) where that
    formula is the original's, as for Llama / Qwen / Mistral; otherwise (Gemma's 1 + weight, other
    casts) as the original's output rescaled by the split sum's error."""
    eps = getattr(original, "variance_epsilon", None) or getattr(original, "eps", 1e-6)
    return BatchVariantRMSNorm(original, eps, _plain_formula_is_the_originals(original, eps))


class BatchVariantRMSNorm(torch.nn.Module):
    """make_batch_variant_norm's module. A class of this module, not of the function: torch saves a compiled
    step (probes/core/precompiled.py) only of modules whose class it can import by name."""

    def __init__(self, original, eps: float, plain: bool):
        super().__init__()
        self.weight = original.weight  # the same Parameter: .to() and state_dict see it here
        self.variance_epsilon = eps
        self.plain = plain  # the plain formula gives the original's bits (_plain_formula_is_the_originals)
        # held outside the module tree, so hooks and bisect see one norm at this name, not two
        self._original = (original,)

    def forward(self, x):  # x: [batch, seq, hidden] (continuous batching packs rows into seq)
        # Each row's result depends only on the path, and the path on how many rows share
        # the call: a lone decode row takes one path, a batch (or a prefill) the other.
        rows = x.numel() // x.shape[-1]
        if is_active("norm") or rows == 1 or one_row_held():  # the mode first: traced under it, no guard on the batch
            return self._original[0](x)
        eps = self.variance_epsilon
        if self.plain:
            return _plain_rms_norm(x, self.weight, _split_mean_of_squares(x), eps)
        # RMSNorm's output scales with rsqrt(mean of squares): the split sum's rsqrt over the
        # exact one, per row, is what the split reduction would have changed (fp32, ~1e-3).
        out = self._original[0](x)
        exact = x.float().pow(2).mean(-1, keepdim=True)
        ratio = torch.rsqrt(_split_mean_of_squares(x) + eps) * torch.sqrt(exact + eps)
        return (out.float() * ratio).to(out.dtype)


def _plain_rms_norm(x, weight, mean_of_squares, eps: float):
    """weight * (x * rsqrt(mean of squares + eps)) cast to x's dtype first (Llama's RMSNorm)."""
    import torch

    return weight * (x.float() * torch.rsqrt(mean_of_squares + eps)).to(x.dtype)


def _plain_formula_is_the_originals(original, eps: float) -> bool:
    """Whether _plain_rms_norm gives the original's bits on a few random rows (one at a time)."""
    import torch

    weight = original.weight
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(4, 1, 1, weight.shape[-1], generator=generator).to(weight.device, weight.dtype)
    with torch.no_grad():
        for x in rows:
            ours = _plain_rms_norm(x, weight, x.float().pow(2).mean(-1, keepdim=True), eps)
            theirs = original(x)
            if ours.dtype != theirs.dtype or not torch.equal(ours, theirs):
                return False
    return True


def _split_mean_of_squares(x):
    """[..., hidden] -> [..., 1] fp32: CHUNKS bf16 partial sums of squares added in order in bf16."""
    import torch

    partial = [c.to(torch.bfloat16).pow(2).sum(-1, keepdim=True) for c in x.chunk(CHUNKS, dim=-1)]
    total = partial[0]
    for p in partial[1:]:
        total = total + p  # bf16 adds, in chunk order
    return total.float() / x.shape[-1]


def inject_batch_variance(model, layer: int = 1) -> str:
    """Replace one decoder layer's post-attention RMSNorm; returns the module's name.

    ValueError when the model has no such layer (then the control cannot be built)."""
    import torch

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not len(layers):
        raise ValueError("the model has no model.layers: the batch-variance control needs a decoder-only LM")
    index = min(layer, len(layers) - 1)
    block = layers[index]
    if not hasattr(block, "post_attention_layernorm"):
        raise ValueError(f"model.layers.{index} has no post_attention_layernorm to make batch-variant")
    if not isinstance(getattr(block.post_attention_layernorm, "weight", None), torch.nn.Parameter):
        raise ValueError(f"model.layers.{index}.post_attention_layernorm has no weight: not a norm the control "
                         "can replace")
    block.post_attention_layernorm = make_batch_variant_norm(block.post_attention_layernorm)
    return f"model.layers.{index}.post_attention_layernorm"
