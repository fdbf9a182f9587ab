"""The static batch's bisect side: rebuild a probe's condition and replay it in lockstep.

The reference (the prompt alone) and the divergent batch are built exactly as the probe built
them (core/batch.py; a run probed before plain prompts got their BOS without it: bisect/probed_prompts.py),
then decoded together step by step with hooks on every module (bisect/lockstep.py) under the
condition's kernels, or with chosen op classes made invariant.
"""

import dataclasses

from nondet.errors import UsageError
from nondet.probes.bisect.bisect import kernel_scope
from nondet.probes.bisect.choose import Target
from nondet.probes.bisect.lockstep import Lockstep, run_lockstep
from nondet.probes.bisect.probed_prompts import as_probed
from nondet.probes.core.batch import Batch, build_batch, tokenize_inputs
from nondet.probes.core.conditions import Condition
from nondet.probes.core.replay import DecodeSettings


def static_replayer(loaded, probe: dict, target: Target, streams: list[dict], settings: DecodeSettings,
                    baseline: tuple[str, ...]):
    """The replay of the target's static condition against its prompt alone."""
    ref, div = probed_batches(loaded.tokenizer, probe, target, streams)
    return _replayer(loaded, ref, div, target.position, settings, target.condition.kernels, baseline)


def probe_prompts(probe: dict, tokenizer) -> list[str]:
    """The probe's prompts as its model read them (several listed; chat-formatted under --chat)."""
    from nondet.probes.core.chat import model_texts

    return model_texts(tokenizer, probe.get("prompts") or [probe["prompt"]], probe.get("chat", False),
                       probe.get("system"))


def probed_prompts(probe: dict, tokenizer, streams: list[dict]) -> tuple[list[str], list[str]]:
    """The probe's prompts and fillers as it tokenized them: without special tokens where its streams'
    prompt_tokens show a run probed before plain prompts got their BOS (bisect/probed_prompts.py)."""
    return as_probed(tokenizer, probe_prompts(probe, tokenizer), list(probe["fillers"]), streams)


def probed_batches(tokenizer, probe: dict, target: Target, streams: list[dict]) -> tuple[Batch, Batch]:
    """The reference (prompt alone) and the divergent batch exactly as the probe built it
    (all its target rows too: when sampling, each target samples with the probe's seed); the static
    source's and each tensor-parallel rank's (tp/bisect.py)."""
    texts, filler_texts = probed_prompts(probe, tokenizer, streams)
    ids, fillers = tokenize_inputs(tokenizer, texts[target.prompt_id], filler_texts)
    if target.condition.fillers == "ragged" and not ids:
        raise UsageError("the target prompt tokenized to nothing")
    pad = tokenizer.pad_token_id
    reference = build_batch(Condition("bisect/ref", target.condition.kernels, 1, (0,), "none"), ids, fillers, pad)
    every = [tokenize_inputs(tokenizer, t, filler_texts)[0] for t in texts] if target.condition.row_prompts else None
    return reference, build_batch(target.condition, ids, fillers, pad, prompts=every)


def _replayer(loaded, ref: Batch, div: Batch, row: int, settings: DecodeSettings, mode: str,
              baseline: tuple[str, ...]):
    """(op classes made invariant on top of the baseline or None, steps, stop at flip) -> Lockstep."""
    model, tokenizer = loaded.model, loaded.tokenizer

    def replay(ops: tuple[str, ...] | None, steps: int | None = None, stop_at_flip: bool = False) -> Lockstep:
        scope = kernel_scope(mode, baseline + (ops or ()), model)
        horizon = dataclasses.replace(settings, max_new_tokens=steps or settings.max_new_tokens)
        return run_lockstep(model, tokenizer, ref, div, horizon, scope, stop_at_flip, row=row)

    return replay
