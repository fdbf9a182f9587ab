"""The invariant experts without a host sync: every routed (token, slot) row at once, sorted by expert.

experts._combine loops over the experts a batch hit, which it must read on the host (bincount ->
tolist): a graph break under torch.compile, and a sync no CUDA graph can capture. This computes the
same bits with shapes known from the input alone:

1. the T x k routed rows are sorted by expert on the device (stable: within an expert, ascending token,
   the loop's row order), with each expert's row count;
2. each projection is one grouped matmul over the sorted rows (nondet::grouped_mm: the Triton grouped
   kernel on CUDA, in the mode's one K order, so a row gets the bits the loop's mm gave it; elsewhere
   an opaque op running the loop's invariant mm per expert, whose host sync a compiled graph never sees);
3. each token's k weighted expert outputs are added in fp32 from zero in increasing expert index, as
   the loop's index_add_ over ascending experts adds them, then cast once.

Slots routed to no valid expert (an index outside 0..E-1) add nothing, as in the loop.
"""

import torch

from nondet.kernels import cpu, custom_ops


def applies(hidden_states: torch.Tensor, module) -> bool:
    """Whether the grouped path computes this call: no gradient needed (the grouped op has no backward;
    a training forward keeps the loop, whose torch.mm autograd records), and either a traced graph (the
    loop's sync would break it) or the Triton kernels (one launch per projection, no sync, in eager too)."""
    from nondet.kernels import ops
    from nondet.kernels.launch import interpreting

    if torch.is_grad_enabled() and (hidden_states.requires_grad or any(p.requires_grad for p in module.parameters())):
        return False
    return torch.compiler.is_compiling() or (ops._triton(hidden_states) and not interpreting())


def combine(module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
            top_k_weights: torch.Tensor) -> torch.Tensor:
    """experts._combine's result for hidden (T, H), top_k_index (T, k), top_k_weights (T, k) -> (T, H)."""
    tokens, k = top_k_index.shape
    num_experts = module.num_experts
    flat = top_k_index.reshape(-1)
    valid = (flat >= 0) & (flat < num_experts)
    key = torch.where(valid, flat, num_experts)  # invalid slots sort last, in a group no kernel computes
    order = torch.sort(key, stable=True).indices  # (T*k,) slot ids, grouped by ascending expert
    expert = key[order]
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device).scatter_add_(
        0, key, torch.ones_like(key))[:num_experts]  # bincount without reading the size back on the host
    x = hidden_states[order // k]  # (T*k, H): each slot's token
    rows = _expert_rows(module, x, expert, counts)
    weight = top_k_weights.reshape(-1)[order].unsqueeze(-1)
    contribution = torch.where(valid[order].unsqueeze(-1), (rows * weight).float(), 0.0)  # (T*k, H) fp32
    by_slot = torch.empty_like(contribution).index_copy_(0, order, contribution).view(tokens, k, -1)
    ascending = torch.sort(key.view(tokens, k), dim=1, stable=True).indices  # each token's slots by expert
    by_expert = by_slot.gather(1, ascending.unsqueeze(-1).expand_as(by_slot))
    out = torch.zeros(by_expert.shape[0], by_expert.shape[2], dtype=torch.float32, device=by_expert.device)
    for j in range(k):  # fp32, from zero, in increasing expert index: the loop's order of additions
        out = out + by_expert[:, j]
    return out.to(hidden_states.dtype)


def activation(self, proj: torch.Tensor) -> torch.Tensor:
    """The module's gate (gated experts) or activation on the first projection's rows (n, I) -> (n, I'), its
    elementwise ops on whole vectors on the CPU (cpu.whole_vectors): otherwise gpt-oss's sigmoid over a
    contiguous (n, I) is partly scalar tail or vector body as the expert's token count n changes."""
    with cpu.whole_vectors(proj):
        return self._apply_gate(proj) if getattr(self, "has_gate", True) else self.act_fn(proj)


def _expert_rows(module, x: torch.Tensor, expert: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """experts._expert_rows for all sorted rows at once: (R, H) -> (R, H)."""
    if getattr(module, "has_gate", True):
        hidden = activation(module, _linear(module, x, module.gate_up_proj, "gate_up_proj_bias", expert, counts))
    else:
        hidden = activation(module, _linear(module, x, module.up_proj, "up_proj_bias", expert, counts))
    rows = _linear(module, hidden, module.down_proj, "down_proj_bias", expert, counts)
    if getattr(module, "has_post_expert_norm", False):
        rows = module.post_expert_norm(rows)
    return rows


def _linear(module, x: torch.Tensor, weight: torch.Tensor, bias_name: str, expert: torch.Tensor,
            counts: torch.Tensor) -> torch.Tensor:
    """Each sorted row times its expert's weight, stored (E, out, in), or (E, in, out) when transposed."""
    y = custom_ops.grouped_mm(x, weight.to(x.dtype), counts, not getattr(module, "is_transposed", False))
    if getattr(module, "has_bias", False):
        bias = getattr(module, bias_name)
        y = y + bias[expert.clamp(max=bias.shape[0] - 1)].to(y.dtype)
    return y
