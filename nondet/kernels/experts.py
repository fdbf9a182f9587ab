"""The experts function the mode selects on a mixture-of-experts model.

transformers 5 dispatches every MoE experts module decorated with `use_experts_implementation`
(Qwen2/3-MoE, Mixtral, DeepSeek-V2/V3, gpt-oss, OLMoE, GraniteMoE, ...) through its
ExpertsInterface, the MoE analog of the attention interface. Its default, grouped_mm, runs
`torch._grouped_mm`, whose reduction order follows how many tokens each expert received: a
token's numbers then depend on everything else in the batch. Registered under
EXPERTS_IMPLEMENTATION, this function computes each token's output so that it depends on that
token alone:

- each expert's two projections are invariant matmuls (the mode's mm: one K order at any M, so an
  expert that received 1 token or 300 computes a token's row the same way); they go through
  torch.mm, so autograd records them (an RL trainer's forward) and the mode's override computes
  them; with the experts class on and the matmul class off (an ablation) the body turns matmul on;
- on the CPU the activation between the projections computes its elementwise ops whose vector body
  and scalar tail round differently (gpt-oss's sigmoid over a contiguous (n, I)) on whole vectors
  (cpu.whole_vectors), so a row's bits do not follow how many tokens the expert received;
- a token's expert outputs are weighted and added in fp32, in increasing expert index, whatever
  else is in the batch, then cast once to the input dtype.

That loop reads on the host which experts a batch hit. Inside a traced graph and on the Triton
kernels, grouped.py computes the same bits without that sync (all routed rows sorted by expert on the
device, one grouped matmul per projection), so a compiled MoE decode step is one graph that CUDA graphs
can replay; the loop stays for the CPU in eager and for a training forward (autograd records its mm).

Registration adds a name; numerics change only when a model selects it (mode.py). When the model
points here but the "experts" class is switched off in an inner context (an ablation), the module's
previous implementation runs instead.
"""

import contextlib

import torch

from nondet.kernels import grouped, tp_experts

EXPERTS_IMPLEMENTATION = "nondet_batch_invariant"
PREVIOUS_ATTR = "_nondet_previous_experts"  # set on each experts module by the mode: what to fall back to
_ENABLED = {"experts": False, "matmul_scope": None}  # set by the mode whenever its active op classes change


def set_enabled(experts: bool, matmul_scope=None) -> None:
    """Called by the mode. matmul_scope: a context factory that turns the matmul class on for the
    experts' body (None when it is on already)."""
    _ENABLED["experts"] = experts
    _ENABLED["matmul_scope"] = matmul_scope


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """ExpertsInterface signature: hidden (T, H), top_k_index (T, k), top_k_weights (T, k) -> (T, H)."""
    if not _ENABLED["experts"]:
        return previous_forward(self)(self, hidden_states, top_k_index, top_k_weights)
    if getattr(self, "_is_expert_parallel", False):
        raise ValueError(f"batch-invariant experts do not support expert parallelism ({type(self).__name__})")
    if tp_experts.leaves():  # --tp-invariant: the down projection's K as tp_tree's fixed tree
        return tp_experts.tree_combine(self, hidden_states, top_k_index, top_k_weights, _invariant_combine)
    return _invariant_combine(self, hidden_states, top_k_index, top_k_weights)


def _invariant_combine(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                       top_k_weights: torch.Tensor) -> torch.Tensor:
    """The mode's experts: the grouped path where it applies, else the loop (same bits)."""
    if grouped.applies(hidden_states, self):  # no host sync: compiled graphs, CUDA graphs, one launch per projection
        return grouped.combine(self, hidden_states, top_k_index, top_k_weights)
    scope = _ENABLED["matmul_scope"]
    with scope() if scope is not None else contextlib.nullcontext():
        return _combine(self, hidden_states, top_k_index, top_k_weights)


def _combine(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
             top_k_weights: torch.Tensor) -> torch.Tensor:
    """Each token's experts, weighted and added in fp32 in increasing expert index -> (T, H)."""
    out = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    for expert in _experts_hit(top_k_index, self.num_experts):
        token, slot = torch.where(top_k_index == expert)  # each token at most once per expert
        rows = _expert_rows(self, expert, hidden_states[token])  # (n, H)
        weight = top_k_weights[token, slot].unsqueeze(-1)
        out.index_add_(0, token, (rows * weight).float())  # distinct tokens: no order within the add
    return out.to(hidden_states.dtype)


def _experts_hit(top_k_index: torch.Tensor, num_experts: int) -> list[int]:
    """Expert ids that received a token, ascending (the fixed combine order). A host sync: eager only
    (a traced graph and the Triton kernels take grouped.combine, which computes the same bits without it)."""
    hit = torch.bincount(top_k_index.reshape(-1).clamp(0, num_experts), minlength=num_experts + 1)[:num_experts]
    return hit.nonzero().flatten().tolist()


def _expert_rows(self, expert: int, x: torch.Tensor) -> torch.Tensor:
    """One expert's output for its tokens x (n, H) -> (n, H), through invariant matmuls."""
    if getattr(self, "has_gate", True):
        hidden = grouped.activation(self, _linear(self, x, self.gate_up_proj[expert], "gate_up_proj_bias", expert))
    else:
        hidden = grouped.activation(self, _linear(self, x, self.up_proj[expert], "up_proj_bias", expert))
    rows = _linear(self, hidden, self.down_proj[expert], "down_proj_bias", expert)
    if getattr(self, "has_post_expert_norm", False):
        rows = self.post_expert_norm(rows)
    return rows


def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias_name: str, expert: int) -> torch.Tensor:
    """x (n, in) times one expert's weight, stored (out, in), or (in, out) when the module is transposed."""
    w = weight.to(x.dtype)
    y = torch.mm(x, w if getattr(self, "is_transposed", False) else w.t())  # the mode's invariant mm
    if getattr(self, "has_bias", False):
        y = y + getattr(self, bias_name)[expert].to(y.dtype)
    return y


def previous_forward(module):
    """The implementation the module had before the mode selected ours (its own forward for "eager")."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    name = getattr(module, PREVIOUS_ATTR, None)
    original = type(module).forward.__wrapped__  # use_experts_implementation keeps it (functools.wraps)
    if name in (None, "eager", EXPERTS_IMPLEMENTATION):
        return original
    return ALL_EXPERTS_FUNCTIONS.get_interface(name, original)


def is_dispatched(module) -> bool:
    """Whether an experts module goes through transformers' ExpertsInterface."""
    return hasattr(type(module).forward, "__wrapped__") and hasattr(module, "has_gate")


def register() -> None:
    """Add EXPERTS_IMPLEMENTATION to transformers' ExpertsInterface (idempotent)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

    ExpertsInterface.register(EXPERTS_IMPLEMENTATION, experts_forward)
    ALL_EXPERTS_FUNCTIONS[EXPERTS_IMPLEMENTATION] = experts_forward


def experts_modules(model) -> list:
    """The model's experts modules dispatched through the interface."""
    return [m for m in model.modules() if is_dispatched(m)]


def select(model, implementation: str) -> str | None:
    """Point every dispatched experts module of `model` at `implementation`; returns the previous name."""
    modules = experts_modules(model)
    if not modules:
        return None
    previous = modules[0].config._experts_implementation
    for module in modules:
        if implementation == EXPERTS_IMPLEMENTATION:
            setattr(module, PREVIOUS_ATTR, previous)
        module.config._experts_implementation = implementation
    if hasattr(model.config, "_experts_implementation"):
        model.config._experts_implementation = implementation
    return previous
