"""The attention function the mode selects on a transformers model.

Registered under ATTN_IMPLEMENTATION in transformers' AttentionInterface (the function) and
AttentionMaskInterface (masks built as for SDPA: a bool mask, or None when plain causal), so
`model.set_attn_implementation(ATTN_IMPLEMENTATION)` routes every attention layer here,
prefill and decode against the KV cache alike. Registration adds a name, nothing else; the
numerics change only when a model selects it.
"""

import torch

from nondet.kernels import autograd, ops, packed

ATTN_IMPLEMENTATION = "nondet_batch_invariant"
_ENABLED = {"attention": False}  # set by the mode (mode.py) whenever its active op classes change


def set_enabled(attention: bool) -> None:
    """Called by the mode: whether the attention class is active in the innermost context."""
    _ENABLED["attention"] = attention


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, sliding_window=None, softcap=None, **kwargs):
    """transformers attention-interface signature -> (attn_output (B, Q, H, D), None)."""
    if not _ENABLED["attention"]:
        # The model still points here but the attention class is switched off (an inner
        # context): run transformers' SDPA path, which takes the same masks.
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, sliding_window=sliding_window, softcap=softcap,
                                      **kwargs)
    sinks = kwargs.get("s_aux")  # gpt-oss: a learned logit per head, (H,)
    if dropout:
        raise ValueError("batch-invariant attention is for inference: dropout must be 0")
    is_causal = kwargs.get("is_causal", getattr(module, "is_causal", True))
    q_len = query.shape[2]
    if attention_mask is None and is_causal and 1 < q_len < key.shape[2]:
        # Without a mask transformers relies on SDPA's is_causal, which aligns top-left: query i
        # sees keys 0..i (a static cache's prefill: the keys past the prompt are empty slots).
        # Our kernels align bottom-right; the two agree once the keys no query sees are dropped.
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    compiling = torch.compiler.is_compiling()
    # a training forward: the same invariant bits, with a backward (autograd.py)
    # (compiled: the custom op, whose backward custom_grads.py gives; eager: autograd.py's Function)
    attend = _traced_attention if compiling else (autograd.attention if grads else ops.attention)
    # Packed rows (several sequences in one row, as trainers pack a micro-batch) are found from the
    # mask's contents (nonzero: a host sync and, under torch.compile, a graph break in every layer), so
    # a traced forward skips the search: transformers' static-cache generate never packs rows, and a
    # compiled training forward over packed rows is not covered (docs/batch-invariant-mode.md).
    bounds = packed.segments(attention_mask, q_len, key.shape[2]) if is_causal and not compiling else None
    if bounds is not None:  # a packed row: each sequence on its own, as its decode computes it
        out = packed.per_segment(lambda q, k, v: attend(q, k, v, None, scaling, True, softcap, sinks, False),
                                 query, key, value, bounds)
        return out, None
    sliding = sliding_window is not None and attention_mask is not None
    return attend(query, key, value, attention_mask, scaling, is_causal, softcap, sinks, sliding), None


def _traced_attention(q, k, v, mask, scale, is_causal, softcap=None, sinks=None, sliding=False):
    """ops.attention as the opaque nondet::attention op, for a graph being traced by torch.compile."""
    from nondet.kernels import custom_ops

    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return custom_ops.attention(q, k, v, mask, scale, is_causal, softcap, sinks, sliding)


def register() -> None:
    """Add ATTN_IMPLEMENTATION to transformers' interfaces (idempotent)."""
    from transformers import AttentionInterface

    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # older layouts keep masks elsewhere; the attention fn still registers
        AttentionMaskInterface = None
    AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
    if AttentionMaskInterface is not None:
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


def select(model, implementation: str) -> None:
    """Point the model (and its sub-models) at an attention implementation. A model that does not call attention
    through the interface (Falcon) keeps its own, with a transformers warning per call, silenced here: its SDPA
    calls reach the mode's aten override instead, and the op census checks what ran either way."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model.set_attn_implementation(implementation)
    except (AttributeError, ValueError):
        for module in model.modules():
            config = getattr(module, "config", None)
            if config is not None and hasattr(config, "_attn_implementation_internal"):
                config._attn_implementation_internal = implementation
    finally:
        hf_logging.set_verbosity(verbosity)
