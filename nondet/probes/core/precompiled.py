"""Compiled decode steps kept on disk and loaded without dynamo's trace (torch's AOT precompile).

`probe --compile` spent most of a warm start in dynamo tracing the model again in every process:
Inductor's caches skip only Inductor (docs/benchmarks.md). torch can save a traced function with its
guards (`torch.compile(fn, fullgraph=True).aot_compile(example)`, `save_compiled_function`) and load it
in a new process without tracing (`torch.compiler.load_compiled_function`); on a CPU that cut a warm
start of the demo-shaped step 17.0 / 22.4 s -> 3.7 / 4.0 s (default / the mode), same bits.

transformers' compiled generate calls `model._compiled_call(**inputs)` for each decode step
(`get_compiled_call`, made once per compile config). `install` puts a PrecompiledSteps there: per
kernels mode one function for every batch size (a symbolic, size-oblivious batch dimension: batch 1
is not specialised, so a probe of 8 batch sizes compiles once per mode, as a server compiles one graph
for its batch buckets; dynamo's JIT compiles 3: batch 1, batch 2, then dynamic), loaded from
NONDET_CACHE/precompiled/ or, the first time, compiled from the step's own inputs and saved. Where torch
cannot do that (a graph break, a guard it cannot save, an experimental API missing), that mode falls back
to the JIT compile transformers would have made, and the log says why. Under the mode the one function
gives the eager mode's bits at every batch size (its kernels are batch-invariant); the default's
compiled numbers at batch 1 are then those of the dynamic graph, not of a graph specialised to 1.

torch saves no guard on object identities; the file's key stands for them (step_key.py). The guards
torch keeps (shapes, dtypes, strides, constants) are checked on each call; a step they refuse is
compiled again and its file replaced. What each slot did goes to a log, which a run's summary reads
(report). Under the mode the graph census still sees every graph: the census store
(kernels/census_store.py) keeps the findings of the graphs compiled when a function was saved, and a
loaded function compiles none.
"""

import os
from pathlib import Path

from nondet.errors import debug_traceback
from nondet.probes.core.aot_step import (aot_compilable, aot_compile, compile_options,
                                         guard_sources_pickled_by_init_fields, load_step, transformers_jit)
from nondet.probes.core.decoding_mode import current
from nondet.probes.core.guard_refusal import failed_part, listed_parts
from nondet.probes.core.step_batch import at_least_two_keys, batch_size, symbolic_shapes
from nondet.probes.core.step_key import kernels_state, step_key

ENV = "NONDET_PRECOMPILE"  # "0": transformers' own JIT compile, as before this file; JIT: dynamic_jit.py's
JIT = "jit"  # transformers' JIT compile with the batch symbolic from the first trace, nothing saved (TP ranks)
EVERY_BATCH = "every batch"  # a slot's batch class: one function per kernels mode serves every batch size
# where torch's guards keep batch 1 apart after all, the class the refused call belongs to gets its own function
# and the other keeps EVERY_BATCH's. On an H200 (torch 2.11, a random Qwen3) the default's guards keep batch 1
# apart in either trace order (the rotary matmul's decomposition, SDPA's mask: transformers' and torch's code).
# The mode's did too, from Inductor's reductions over the mask cut in place; ops._cut copies it in a trace now,
# and the mode compiles one function there (docs/benchmarks.md, 2026-11-29 07:40-09:30 and 10:52)
BATCH_ONE, BATCH_MORE = "batch 1", "batch 2+"
FIXED_LENGTHS = ".fixed-lengths"  # beside a slot's file: its trace with the key length symbolic failed (why)
# (mode name, batch class, what) each time a slot's function was obtained or replaced, in this process: a
# run's summary reports the entries made since it began (report(since)), not an earlier run's
_LOG: list[tuple[str, str, str]] = []


def enabled() -> bool:
    return os.environ.get(ENV, "1") not in ("0", JIT)


def symbolic_jit() -> bool:
    """NONDET_PRECOMPILE=jit: no saved steps, one JIT graph per kernels mode for every batch size."""
    return os.environ.get(ENV) == JIT


def install(model, compile_config, folder: Path) -> "PrecompiledSteps":
    """Make transformers' compiled generate call a PrecompiledSteps for this model and compile config
    (kept on the model: one object, its functions loaded once per process)."""
    steps = getattr(model, "_compiled_call", None)
    if not isinstance(steps, PrecompiledSteps) or steps.compile_config != compile_config:
        steps = PrecompiledSteps(model, compile_config, folder)
    model._compiled_call, model._last_compile_config = steps, compile_config
    return steps


def uninstall(model) -> None:
    """Give transformers back its own compiled call (a speculative call's verification steps are of
    other shapes than one-token decode steps: they stay on transformers' JIT compile)."""
    if isinstance(getattr(model, "_compiled_call", None), PrecompiledSteps):
        del model._compiled_call


def log_position() -> int:
    """Where a run begins in this process's log (report(since))."""
    return len(_LOG)


def report(since: int = 0) -> dict:
    """What the saved functions did from log position `since` on, per kernels mode and batch class (the
    last word per slot): summary.json's decode_path "precompiled"."""
    doc: dict = {}
    for mode, cls, what in _LOG[since:]:
        doc.setdefault(mode, {})[cls] = what
    return doc


def forward_step(model, **inputs):
    """What a saved function traces: one call of the model (transformers passes keyword inputs only), its
    logits alone: a saved function cannot rebuild transformers' output class (it needs the saving
    process's module references), so __call__ wraps them. The trace is told the key lengths are 2 or more
    (step_batch.at_least_two_keys: what Inductor needs to split a loop over batch x length)."""
    at_least_two_keys(inputs)
    return model(**inputs).logits


class PrecompiledSteps:
    """transformers' `_compiled_call`: the decode step through a saved function per kernels mode. A slot is
    (the decoder's name for the mode, the batch class, kernels_state()); the class is EVERY_BATCH, or
    BATCH_ONE / BATCH_MORE for the class whose calls EVERY_BATCH's function refused (_guards_refused)."""

    def __init__(self, model, compile_config, folder: Path) -> None:
        self.model = model
        self.compile_config = compile_config
        self.folder = folder
        self.functions: dict[tuple[str, str, str], object] = {}  # slot -> saved, loaded or JIT function
        self.loaded: dict[tuple[str, str, str], bool] = {}  # True: read from disk; False: compiled here and saved
        self.fallbacks: dict[tuple[str, str, str], str] = {}  # why a (mode, batch) runs transformers' JIT compile
        self.ran: set = set()  # slots whose function has returned once
        self.paths: dict[tuple[str, str, str], Path] = {}  # slot -> its file (_path)
        self.refused: dict[tuple[str, str, str], str] = {}  # slot -> why its guards refused a call (traced again)
        self.split: dict[tuple[str, str], str] = {}  # (mode, kernels state) -> the batch class EVERY_BATCH refused
        self.apart: dict[tuple[str, str, str], str] = {}  # split slot -> EVERY_BATCH's refusal of its class
        self.traced_on: dict[tuple[str, str, str], str] = {}  # slot -> the batch class it was traced on here
        self.fixed_lengths: dict[tuple[str, str, str], str] = {}  # slot -> why its trace with the key length
        # symbolic failed: it is traced with the length fixed (one function per prompt length), see _fix_lengths

    def __call__(self, **inputs):
        # the decoder's name for the kernels mode (summary) and what is really on (the key): a call outside
        # decoding() under the mode must not meet the default kernels' function. kernels_state() is read at
        # each step (2 us on a CPU, 0.1% of a 1.9 ms GPU step): the mode may change between steps.
        mode, state, batch = current(), kernels_state(), _batch_class(inputs)
        slot = (mode, batch if self.split.get((mode, state)) == batch else EVERY_BATCH, state)
        if slot not in self.functions:
            self._obtain(slot, inputs)
        return self._run(slot, inputs)

    def _run(self, slot, inputs):
        """One step through the slot's function: a refusal of its guards or a failure of its first call
        handled (_guards_refused, _first_call_failed)."""
        if slot in self.fallbacks:
            return self.functions[slot](**inputs)
        try:
            logits = self.functions[slot](self.model, **inputs)
        except Exception as exc:  # noqa: BLE001 - see _first_call_failed
            if not (isinstance(exc, RuntimeError) and "GuardManager check failed" in str(exc)):
                return self._first_call_failed(slot, exc, inputs)
            return self._guards_refused(slot, inputs, exc)
        self.ran.add(slot)
        return _output(logits, inputs)

    def _guards_refused(self, slot, inputs, refusal: Exception):
        """Inputs of another form than the saved function's (its kept guards refused them). EVERY_BATCH's
        function refusing a batch class (it was traced on the other) splits the mode: this class gets its
        own slot, loaded or compiled, and EVERY_BATCH's file is kept for the other; so the next process
        loads both and traces nothing. Else (a refusal of the class it was traced on in this process, e.g.
        an int it specialised, or of a slot of its own) trace again and replace the file; a trace that fails
        there hands the slot to transformers' JIT compile, as a first compile that fails does. A function
        traced with the key length fixed that meets another length (the next prompt's cache) goes to the JIT
        compile too: traced again it would be once per prompt length, where dynamo's JIT makes the length
        dynamic at the second."""
        mode, batch, state = slot
        why = _refusal(refusal, {"inputs": inputs, "model": self.model})
        another_length = self._lengths_fixed(slot) and ".size()[0]" not in why
        if (batch == EVERY_BATCH and (mode, state) not in self.split
                and self.traced_on.get(slot) != _batch_class(inputs) and not another_length):
            self.split[(mode, state)] = own = _batch_class(inputs)
            slot = (mode, own, state)  # new: only this split reaches it
            self.apart[slot] = why
            function = self._obtain(slot, inputs)
        elif another_length:
            self._to_jit(slot, refusal, why=f"the key length fixed, a call of another length ({why})")
            self._log(slot)
            function = self.functions[slot]
        else:
            self.refused[slot] = why
            self._compile_or_jit(slot, inputs)
            self._log(slot)
            function = self.functions[slot]
        if slot in self.fallbacks:
            return function(**inputs)
        logits = function(self.model, **inputs)
        self.ran.add(slot)
        return _output(logits, inputs)

    def _first_call_failed(self, slot, exc, inputs):
        """A saved function that fails its first call (torch's precompile is experimental: e.g. a wrapper
        it restores differently) is traced again with the key length fixed (the length symbolic, Inductor's
        code for the mode failed at its first run on the GPU: docs/benchmarks.md), and one traced so hands the
        slot to transformers' JIT compile; a later failure is raised."""
        if slot in self.ran:
            raise exc
        self._step_down(slot, exc, inputs)
        self._log(slot)
        return self._run(slot, inputs)

    def _obtain(self, slot, inputs):
        """The slot's function: loaded from its file, else (no file, or one torch cannot load) compiled and
        saved, else transformers' JIT compile."""
        self._read_marker(slot)
        try:
            self.functions[slot] = self._load(slot)
            self.loaded[slot] = True
        except Exception:  # noqa: BLE001 - no file, or one an older torch wrote: compile it again
            self._compile_or_jit(slot, inputs)
        self._log(slot)
        return self.functions[slot]

    def _compile_or_jit(self, slot, inputs) -> None:
        """Trace the slot with the key length symbolic; where that fails, with it fixed; where that fails too,
        transformers' JIT compile."""
        try:
            self.functions[slot] = self._compile(slot, inputs)
        except Exception as exc:  # noqa: BLE001 - torch's experimental precompile fails in many ways
            self._step_down(slot, exc, inputs)

    def _step_down(self, slot, exc: Exception, inputs) -> None:
        """`exc` failed the slot's trace or its first call: trace it with the key length fixed, or where it
        already was, hand it to transformers' JIT compile."""
        if self._lengths_fixed(slot):
            self._to_jit(slot, exc)
        else:
            self._fix_lengths(slot, exc)
            self._compile_or_jit(slot, inputs)

    def _lengths_fixed(self, slot) -> bool:
        """Whether the slot traces with the key length fixed: its symbolic trace failed in this process, or in
        an earlier one (_read_marker)."""
        return slot in self.fixed_lengths

    def _read_marker(self, slot) -> None:
        """An earlier process's symbolic trace of the slot failed: the marker beside its file says why, so a
        cold start does not fail that trace again."""
        marker = self._path(slot).with_suffix(FIXED_LENGTHS)
        if slot not in self.fixed_lengths and marker.is_file():
            self.fixed_lengths[slot] = marker.read_text().strip()

    def _fix_lengths(self, slot, exc: Exception) -> None:
        """From now on the slot traces with the key length fixed; `exc` (why the symbolic trace failed) is kept
        in the summary and in a marker beside the slot's file (the key changes with nondet's source, so a
        release that mends the trace tries it again)."""
        self.fixed_lengths[slot] = _reason(exc)
        debug_traceback(exc)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._path(slot).with_suffix(FIXED_LENGTHS).write_text(self.fixed_lengths[slot] + "\n")

    def _to_jit(self, slot, exc: Exception, why: str | None = None) -> None:
        """The slot runs transformers' own JIT compile from now on; `why` or else `exc` says why (summary; its
        traceback on stderr under NONDET_DEBUG=1, since the summary keeps one line of a message that can be a
        subprocess's)."""
        self.fallbacks[slot] = why or _reason(exc)
        debug_traceback(exc)
        self.functions[slot] = transformers_jit(self.model, self.compile_config)

    def _path(self, slot) -> Path:
        """The slot's file (its key hashes the model's module tree and nondet's source: once per slot)."""
        if slot not in self.paths:
            self.paths[slot] = self.folder / f"{step_key(self.model, self.compile_config, slot)}.bin"
        return self.paths[slot]

    def _load(self, slot):
        with open(self._path(slot), "rb") as fh:
            return load_step(fh, compile_options(self.compile_config)["options"])

    def _compile(self, slot, inputs):
        """Trace forward_step on these inputs, save, return it. The batch dimension and the KV cache's length
        are symbolic from this first trace (step_batch.symbolic_shapes), so one function serves every batch
        size of a probe, 1 included, and every prompt length: one compile per kernels mode where there were
        two (batch 1, then 2+) and one more per prompt length."""
        options = compile_options(self.compile_config)
        held = self.model.__dict__.pop("_compiled_call", None)  # saved state must not reach our loaded functions
        try:
            lengths = not self._lengths_fixed(slot)
            with guard_sources_pickled_by_init_fields(), symbolic_shapes(inputs, lengths=lengths):
                function = aot_compile(aot_compilable(forward_step, options), ((self.model,), inputs))
        finally:
            if held is not None:
                self.model._compiled_call = held
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(slot)
        partial = path.with_suffix(f".{os.getpid()}.part")
        with guard_sources_pickled_by_init_fields():
            function.save_compiled_function(str(partial))
        partial.replace(path)  # a reader never sees half a file
        self.loaded[slot] = False
        self.traced_on[slot] = _batch_class(inputs)
        return function

    def describe(self, slot) -> str:
        """'loaded', 'compiled and saved' (and why traced again), or 'JIT compile: why'."""
        if slot in self.fallbacks:
            return f"JIT compile: {self.fallbacks[slot]}"
        what = "loaded" if self.loaded.get(slot) else "compiled and saved"
        if slot in self.fixed_lengths:
            what += f" (the key length fixed: its symbolic trace failed: {self.fixed_lengths[slot]})"
        if slot in self.refused:
            what += f" (traced again: its guards refused a call; {self.refused[slot]})"
        if slot in self.apart:
            what += f" (its own function: {EVERY_BATCH}'s guards refused this batch class; {self.apart[slot]})"
        return what

    def _log(self, slot) -> None:
        _LOG.append((slot[0], slot[1], self.describe(slot)))


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:160] if text else ''}"


def _refusal(exc: Exception, frame: dict) -> str:
    """Why the kept guards refused a call: the listed guard that is false on the call's frame
    (guard_refusal.failed_part), e.g. SDPA's `mask.size()[0] != 1` or a sliding window cache's Python int length,
    which dynamo specialises on its first trace and makes symbolic on the next; where none is found false, the
    first guard torch lists; where it lists none, the message."""
    failed = failed_part(str(exc), frame)
    if failed is not None:
        return f"the guard that failed: {failed}"
    listed = listed_parts(str(exc))
    return f"the first guard torch lists: {listed[0]}" if listed else _reason(exc)


def _batch_class(inputs: dict) -> str:
    return BATCH_ONE if batch_size(inputs) == 1 else BATCH_MORE


def _output(logits, inputs: dict):
    """What transformers' decode loop reads from a step: its logits, and the cache it wrote in place."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    cache = next((v for v in inputs.values() if hasattr(v, "layers")), None)
    return CausalLMOutputWithPast(logits=logits, past_key_values=cache)

