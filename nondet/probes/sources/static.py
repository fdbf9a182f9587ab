"""The static source: one batched `model.generate` call per condition.

Conditions come from conditions.plan_conditions, per kernels mode and per target prompt:
the prompt alone (the reference), then batches of the configured sizes with the target in
the configured rows and same-length fillers (or copies) around it, and ragged batches when
asked. Each target row of a condition becomes one StreamRecord.
"""

import contextlib

from nondet.probes import conditions as cond
from nondet.probes.batch import build_batch, tokenize_inputs
from nondet.probes.loading import load_model
from nondet.probes.numerics import fingerprint
from nondet.probes.pieces import token_piece
from nondet.probes.replay import DecodeSettings, generate_condition
from nondet.probes.sources.base import Emit, Opened, Planned
from nondet.probes.summarize import as_summary, summarize_modes
from nondet.rundir.records import ConditionRecord, StepRecord, StreamRecord


class StaticSource:
    kind = "static"

    def __init__(self, config, loaded=None) -> None:
        self.config = config  # ProbeConfig
        self.loaded = loaded  # a LoadedModel already in memory (the in-memory probe), else loaded in open()
        self.inputs: list[tuple[list[int], list[list[int]]]] = []  # per prompt: (target ids, filler ids)
        self.run_ids = 0

    def open(self) -> Opened:
        self.loaded = self.loaded or load_model(self.config.model)
        self.inputs = [tokenize_inputs(self.loaded.tokenizer, p, self.config.fillers) for p in self.config.targets]
        return Opened(fingerprint(self.loaded.description, ",".join(self.config.kernels)))

    def attach(self, writer) -> None:
        pass  # nothing to amend: the header is complete when the run starts

    def plan(self) -> list[Planned]:
        c = self.config
        several = len(c.targets) > 1
        planned = [cond.plan_conditions(c.batch_sizes, c.placement, c.runs, c.ragged, mode, k, several)
                   for mode in c.kernels for k in range(len(c.targets))]
        return [Planned(x.condition_id, x.label, x.kernels, x) for group in planned for x in group]

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        condition: cond.Condition = planned.plan
        target, fillers = self.inputs[condition.prompt_id]
        settings = DecodeSettings(self.config.max_new_tokens, self.config.temperature, self.config.seed)
        for row, steps in replay_condition(self.loaded.model, self.loaded.tokenizer, condition, target, fillers,
                                           settings).items():
            emit(self._stream(condition, row, steps, len(target)))
        return condition_record(condition)

    def summarize(self, streams: list[dict]):
        return as_summary(summarize_modes(streams, self.loaded.tokenizer, self.config.targets))

    def close(self) -> None:
        pass

    def _stream(self, condition: cond.Condition, row: int, steps: list[dict], prompt_tokens: int) -> StreamRecord:
        tok = self.loaded.tokenizer
        self.run_ids += 1
        return StreamRecord(
            run_id=self.run_ids - 1, condition_id=condition.condition_id, kernels=condition.kernels, position=row,
            is_reference=condition.is_reference, prompt_id=condition.prompt_id, prompt_tokens=prompt_tokens,
            finish="length" if steps else "empty", text=tok.decode([s["token"] for s in steps]),
            steps=[step_record(s, token_piece(tok, s["token"])) for s in steps])


def replay_condition(model, tokenizer, condition: cond.Condition, target: list[int], fillers: list[list[int]],
                     settings: DecodeSettings) -> dict[int, list[dict]]:
    """One condition: build its batch, generate under its kernels; {target row: step dicts}."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch = build_batch(condition, target, fillers, pad_id or 0)
    with kernels_mode(condition.kernels, model):
        return generate_condition(model, tokenizer, batch, settings)


def kernels_mode(mode: str, model):
    """The batch-invariant mode around a call, or nothing for the default kernels."""
    if mode == "default":
        return contextlib.nullcontext()
    from nondet.kernels import batch_invariant

    return batch_invariant(model=model)


def step_record(step: dict, piece: str) -> StepRecord:
    """A recorder step dict (token, logprob, top, margin as float.hex) with its piece."""
    known = ("token", "logprob", "top", "margin")
    return StepRecord(token=step["token"], piece=piece, logprob=step.get("logprob"), margin=step.get("margin"),
                      top=step.get("top"), extra={k: v for k, v in step.items() if k not in known + ("piece",)})


def condition_record(condition: cond.Condition) -> ConditionRecord:
    return ConditionRecord(condition_id=condition.condition_id, kernels=condition.kernels,
                           batch_size=condition.batch_size, positions=list(condition.positions),
                           fillers=condition.fillers, label=condition.label, load=condition.load,
                           prompt_id=condition.prompt_id)
