"""A deliberately batch-variant RMSNorm: the positive control that fires on every machine.

Whether a host's own kernels are batch-variant depends on its BLAS, its CPU and its thread
count (on one CPU the embedded demo flips a token at step 93, on another only at step 266).
A check that the detector fires must not depend on that, so this module builds the variance
on purpose, the way a split reduction does: one fp32 sum of squares per row when a single
row is computed, but 8 chunks with bf16 partial sums, added in order, when several rows
share the call (a strategy chosen by the number of rows). A request decoding alone and the
same request decoding beside others therefore get different bits from their first decode
step; prefill (many rows either way) is the same in both.

Under the batch-invariant mode's "norm" class it takes the one-row path for every batch,
as swapping in an invariant norm kernel would: so --confirm, bisect's ablation and the gate
see a fix that really works. Nothing here runs unless a caller installs it.
"""

CHUNKS = 32  # partial sums of the split path, added one by one into a bf16 total


def make_batch_variant_norm(original):
    """A module that replaces `original` (an RMSNorm with .weight and an epsilon)."""
    import torch

    from nondet.kernels.mode import is_active

    eps = getattr(original, "variance_epsilon", None) or getattr(original, "eps", 1e-6)

    class BatchVariantRMSNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = original.weight
            self.variance_epsilon = eps

        def forward(self, x):  # x: [batch, seq, hidden] (continuous batching packs rows into seq)
            # Each row's result depends only on the path, and the path on how many rows share
            # the call: a lone decode row takes one path, a batch (or a prefill) the other.
            rows = x.numel() // x.shape[-1]
            if rows == 1 or is_active("norm"):
                return self._normalize(x, x.float().pow(2).mean(-1, keepdim=True))
            partial = [c.to(torch.bfloat16).pow(2).sum(-1, keepdim=True) for c in x.chunk(CHUNKS, dim=-1)]
            total = partial[0]
            for p in partial[1:]:
                total = total + p  # bf16 adds, in chunk order
            return self._normalize(x, total.float() / x.shape[-1])

        def _normalize(self, x, variance):
            return self.weight * (x.float() * torch.rsqrt(variance + self.variance_epsilon)).to(x.dtype)

    return BatchVariantRMSNorm()


def inject_batch_variance(model, layer: int = 1) -> str:
    """Replace one decoder layer's post-attention RMSNorm; returns the module's name.

    ValueError when the model has no such layer (then the control cannot be built)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not len(layers):
        raise ValueError("the model has no model.layers: the batch-variance control needs a decoder-only LM")
    index = min(layer, len(layers) - 1)
    block = layers[index]
    if not hasattr(block, "post_attention_layernorm"):
        raise ValueError(f"model.layers.{index} has no post_attention_layernorm to make batch-variant")
    block.post_attention_layernorm = make_batch_variant_norm(block.post_attention_layernorm)
    return f"model.layers.{index}.post_attention_layernorm"
