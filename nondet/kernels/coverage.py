"""Which modules of a model the mode cannot make batch-invariant: refuse them, never guess.

The mode reaches a model only through aten overrides (matmul, norm, softmax, top-k), transformers'
AttentionInterface and its ExpertsInterface. A module that computes some other way (an experts
module with its own fused kernel, expert parallelism, an attention that bypasses the interface)
would keep its batch variance while the mode claimed invariance, so `check` raises
UnsupportedModel, one line naming the first such module and what is missing.
"""

import math

import torch

from nondet.kernels import experts


class UnsupportedModel(ValueError):
    """The mode cannot make this model batch-invariant; the message names the module."""


def uncovered(model) -> list[tuple[str, str]]:
    """(module path, what is missing) for every module the mode cannot cover, in model order."""
    found = []
    for path, module in model.named_modules():
        reason = _reason(module)
        if reason:
            found.append((path or type(module).__name__, reason))
    return found


def _reason(module) -> str | None:
    kind = type(module).__name__
    if kind.endswith("Experts") and module.__class__.__module__.startswith("transformers"):
        if experts.is_dispatched(module):
            if getattr(module, "_is_expert_parallel", False):
                return "expert parallelism (experts sharded across ranks) is not supported"
            return None
        if not any(isinstance(m, torch.nn.Linear) for m in module.modules()):
            return (f"{kind} computes its experts outside transformers' ExpertsInterface and without "
                    "nn.Linear, so the mode cannot reach its matmuls")
    return None


def check(model) -> None:
    """Raise UnsupportedModel naming the first module the mode cannot cover (by its structure)."""
    missing = uncovered(model)
    if missing:
        path, reason = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UnsupportedModel(f"the batch-invariant mode cannot cover {path}: {reason}{more}")


def verify(model, mode_scope, compiled: bool = False, allow_uncovered: bool = False, saved=None):
    """The model's op census (census.py), after refusing what it shows the mode does not cover.

    mode_scope: the whole mode on the model, as census.take takes it (mode.verify_coverage passes it);
    saved: census.take's store between processes, or None.
    Raises UnsupportedModel, one line: for the first uncovered op (module and op) unless
    `allow_uncovered` (then the caller labels its run "partly invariant"), and always when the
    mode's logits leave the default kernels' beyond rounding."""
    from nondet.kernels import census

    check(model)
    found = census.take(model, mode_scope, compiled, saved)
    missing = found.uncovered()
    if missing and not allow_uncovered:
        first = missing[0]
        raise UnsupportedModel(refusal_line(first.module or found.model_class, first.op, len(missing) - 1))
    if math.isnan(found.max_logit_diff):  # the model's own logits are NaN (census._largest_diff): not the mode's doing
        from nondet.errors import NonFiniteLogitsError

        raise NonFiniteLogitsError(None, None, str(next(model.parameters()).dtype))
    if not found.agrees():
        raise UnsupportedModel(f"the batch-invariant mode changes {found.model_class}'s logits by up to "
                               f"{found.max_logit_diff:.3g} (rounding allows {found.tolerance:.3g}): a kernel "
                               "computes something else, so the mode refuses this model")
    return found


def refusal_line(module: str, op: str, others: int, where: str = "") -> str:
    """The one line that refuses a model for an op the mode does not cover (`where`: ' in the compiled
    graph' for what Inductor compiled), naming how many more there are and the way to run it anyway."""
    hint = "--allow-uncovered runs it labelled partly invariant"
    more = f" (and {others} more; {hint})" if others else f" ({hint})"
    return f"{module}: {op} is not covered by the batch-invariant mode{where}{more}"
