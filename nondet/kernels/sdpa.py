"""A direct F.scaled_dot_product_attention call, routed to the mode's attention.

Most transformers models reach attention through the AttentionInterface (hf.py), which the mode
selects on the model. Some call `F.scaled_dot_product_attention` themselves (Falcon, Bloom's
successors, custom code, the vision towers of multimodal models): their attention would keep SDPA's
kernels, whose split of the KV length follows the batch on a GPU. The mode therefore also overrides
aten::scaled_dot_product_attention at its CompositeImplicitAutograd key (the kernel that picks
flash / efficient / math), so such a call computes the same per-row arithmetic as the interface
path. Installed by the mode with the attention class (mode.py); nothing happens at import time.

What it takes: 4-D (B, H, Q, D) float inputs of one dtype, no dropout. Anything else goes to SDPA's
math kernel, which the census (census.py) then sees and reports as uncovered.
"""

import torch

aten = torch.ops.aten
NAME = "scaled_dot_product_attention"
DISPATCH_KEY = "CompositeImplicitAutograd"


def takes(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
          enable_gqa=False) -> bool:
    from nondet.kernels.ops import TRITON_DTYPES

    tensors = (query, key, value)
    return (dropout_p == 0.0 and all(t.dim() == 4 for t in tensors)
            and len({t.dtype for t in tensors}) == 1 and query.dtype in TRITON_DTYPES
            and query.shape[1] % key.shape[1] == 0)


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
              enable_gqa=False):
    """SDPA's signature -> (B, H, Q, Dv), computed by the invariant attention."""
    if not takes(query, key, value, attn_mask, dropout_p, is_causal, scale=scale):
        return aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal,
                                                       scale=scale, enable_gqa=enable_gqa)[0]
    key, value = _top_left(query, key, value, attn_mask, is_causal)
    return _attend(query, key, value, attn_mask, scale, is_causal).transpose(1, 2)


def traced(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """The same call as the opaque nondet::attention, for the traced mode (traced.py): dynamo then never
    traces the override above, whose CPU path reads the mask's values (a full-graph trace, as a saved
    decode step needs, refused that data-dependent read on Falcon). None where `takes` refuses: the call
    is left to the compiler, and the census reports it."""
    from nondet.kernels.hf import _traced_attention

    if not takes(query, key, value, attn_mask, dropout_p, is_causal, scale=scale):
        return None
    key, value = _top_left(query, key, value, attn_mask, is_causal)
    return _traced_attention(query, key, value, attn_mask, scale, is_causal).transpose(1, 2)


def _top_left(query, key, value, mask, is_causal):
    """SDPA's is_causal aligns top-left (query i sees keys 0..i); ours bottom-right (hf.py): without a
    mask, a causal call with fewer queries than keys keeps the first keys only."""
    q_len = query.shape[2]
    if mask is None and is_causal and q_len < key.shape[2]:
        return key[:, :, :q_len], value[:, :, :q_len]
    return key, value


def _attend(query, key, value, mask, scale, is_causal):
    from nondet.kernels import autograd, ops
    from nondet.kernels.hf import _traced_attention

    if torch.compiler.is_compiling() or _is_fake(query):
        return _traced_attention(query, key, value, mask, scale, is_causal)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        return autograd.attention(query, key, value, mask, scale, is_causal, None, None, False)
    return ops.attention(query, key, value, mask, scale, is_causal)


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)
