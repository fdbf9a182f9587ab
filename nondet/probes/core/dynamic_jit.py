"""transformers' JIT-compiled decode step with the batch dimension symbolic from the first trace: one graph
per kernels mode for every batch size of a probe, where transformers' own compiled call traces batch 1
apart and then again for 2+ (dynamo makes a dimension dynamic only after a size changed). Nothing is
saved: the path of tensor-parallel ranks, where saved steps are off (NONDET_PRECOMPILE=jit; precompiled.py
saves them for one process).
"""

import weakref

from nondet.probes.core.step_batch import at_least_two_keys, caches, symbolic_shapes


def install(model, compile_config) -> "DynamicBatchJIT":
    """Make transformers' compiled generate call a DynamicBatchJIT for this model and compile config (kept on
    the model: one object, so its traced graphs serve every later call)."""
    call = getattr(model, "_compiled_call", None)
    if not isinstance(call, DynamicBatchJIT) or call.compile_config != compile_config:
        call = DynamicBatchJIT(model, compile_config)
    model._compiled_call, model._last_compile_config = call, compile_config
    return call


def uninstall(model) -> None:
    if isinstance(getattr(model, "_compiled_call", None), DynamicBatchJIT):
        del model._compiled_call


class DynamicBatchJIT:
    """transformers' `_compiled_call`: torch.compile of the model's call, as transformers makes it
    (get_compiled_call), each call's batch-led tensors marked symbolic before dynamo sees them."""

    def __init__(self, model, compile_config) -> None:
        from nondet.probes.core.aot_step import transformers_jit

        self.compile_config = compile_config
        # the trace told the key lengths are >= 2 first, as a saved step's is (step_batch.at_least_two_keys: under
        # symbolic_shapes a length's range starts at 0, and Inductor could not split a loop over batch x length)
        self.jit = transformers_jit(model, compile_config, call=_told_call(model))
        # caches whose layers are marked: walking a 36-layer cache's tensors at every step cost 88 us on a
        # 2-core CPU; the held static caches (static_caches.py) keep their tensors and so their marks
        self.marked = weakref.WeakSet()

    def __call__(self, **inputs):
        held = caches(inputs)
        with symbolic_shapes(inputs, with_caches=any(c not in self.marked for c in held)):
            self.marked.update(held)
            return self.jit(**inputs)


def _told_call(model):
    """The model's call, after step_batch.at_least_two_keys on its inputs (traced with it)."""
    def call(**inputs):
        at_least_two_keys(inputs)
        return model(**inputs)

    return call
