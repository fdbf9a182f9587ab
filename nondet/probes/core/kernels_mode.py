"""The kernels of one call: the batch-invariant mode around it, or the default kernels.

Every source and every bisect replay enters a condition's kernels through `kernels_mode`, so a
model the mode cannot cover is refused the same way everywhere (its op census, kernels/census.py).
"""

import contextlib

COMPILED_CALLS = "compiled_calls"  # the mode traced inside generate's compiled forwards only (kernels/traced.py)


def kernels_mode(mode: str, model, ops=None, traceable: bool | str = False, allow_uncovered: bool = False):
    """The batch-invariant mode around a call (all op classes, or `ops`), or nothing for the default
    kernels. A model the mode cannot cover is UnsupportedModelError (exit 3), one line naming the module
    and op (its op census, kernels/census.py), unless allow_uncovered (the run is partly invariant).
    traceable: the body runs a torch.compile'd forward (kernels/traced.py); COMPILED_CALLS: only the
    forwards generate compiles (transformers' get_compiled_call) see the traced mode."""
    if mode == "default" and ops is None:
        return contextlib.nullcontext()
    from nondet.kernels import batch_invariant
    from nondet.probes.core.kernel_coverage import census_entry

    census_entry(model, bool(traceable), allow_uncovered)  # refuses here, as one line (cached census)
    return batch_invariant(ops=ops, model=model, traceable=traceable, allow_uncovered=allow_uncovered)
