"""Batch-invariant attention inside transformers' continuous-batching engine.

The engine packs the query tokens of every request in the batch into one ragged sequence and
hands the attention function its paged KV cache; its sdpa path then attends over all the
packed keys at once under a block mask, so a request's sums depend on where the other
requests sit. This function updates the paged cache exactly as the sdpa path does, then
attends each request on its own with nondet's batch-invariant kernel (causal, aligned to the
end of the request's keys): the arithmetic a request gets alone, whatever shares the batch.
"""

import contextlib

CB_ATTN_IMPLEMENTATION = "nondet_cb_batch_invariant"


def cb_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                         scaling: float | None = None, cache=None, **kwargs):
    """query (1, H, Tq, D) packed; key/value (1, KVH, Tq, D) new tokens, or already the gathered
    cache (1, KVH, Tk, D) when `cache` is None -> (1, Tq, H, D)."""
    import torch

    from nondet.kernels import attention

    assert "cu_seq_lens_q" in kwargs, "only for transformers' continuous-batching engine (packed requests)"
    if cache is not None:
        # transformers <= 5.23 hands the engine's paged cache to the attention function to update
        key, value = _update(cache, key, value, module.layer_idx, kwargs)
    # transformers >= 5.24 updates it in the attention layer and hands over the gathered keys; a block
    # table instead means the keys stay in the paged cache for a flash kernel to read, not ours
    assert kwargs.get("block_table") is None, "the paged cache's block-table layout is flash-only"
    cu_q = kwargs["cu_seq_lens_q"].tolist()  # request i's queries: [cu_q[i], cu_q[i+1])
    cu_k = _for_layer(kwargs["cu_seq_lens_k"], module).tolist()  # its keys in the gathered cache
    parts = [attention(query[:, :, q0:q1], key[:, :, k0:k1], value[:, :, k0:k1], None, scale=scaling, is_causal=True)
             for q0, q1, k0, k1 in zip(cu_q, cu_q[1:], cu_k, cu_k[1:]) if q1 > q0]
    return torch.cat(parts, dim=1), None


@contextlib.contextmanager
def invariant_attention(model):
    """Point the model's attention at cb_attention_forward for the body; restore after."""
    _register()
    previous = model.config._attn_implementation
    model.set_attn_implementation(CB_ATTN_IMPLEMENTATION)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def _update(cache, key, value, layer_idx: int, kwargs):
    """The paged cache's update -> the gathered keys and values (1, KVH, Tk, D). 5.19-5.23 take the
    attention kwargs; 5.17-5.18 take the read and write indices and return (Tk, KVH, D)."""
    import inspect

    if "kwargs" in inspect.signature(cache.update).parameters:
        return cache.update(key_states=key, value_states=value, layer_idx=layer_idx, kwargs=kwargs)
    key, value = cache.update(key_states=key, value_states=value, layer_idx=layer_idx,
                              read_index=kwargs["read_index"], write_index=kwargs["write_index"])
    return key.transpose(0, 1).unsqueeze(0), value.transpose(0, 1).unsqueeze(0)


def _for_layer(cu_seq_lens_k, module):
    if not isinstance(cu_seq_lens_k, dict):
        return cu_seq_lens_k
    if len(cu_seq_lens_k) == 1:
        return next(iter(cu_seq_lens_k.values()))
    return cu_seq_lens_k[getattr(module, "layer_type", None) or "full_attention"]


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CB_ATTN_IMPLEMENTATION, cb_attention_forward)
    AttentionMaskInterface.register(CB_ATTN_IMPLEMENTATION, sdpa_mask)
