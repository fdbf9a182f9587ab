"""The speculative source: plain greedy decoding vs speculative decoding of the same prompt.

Per kernels mode and target prompt: the reference is plain greedy decoding of the prompt
alone (`<kernels>/[p<k>/]bs1/ref`); then one condition per `--speculative` form
(`<kernels>/[p<k>/]spec/ngram4`): the same prompt decoded greedily with transformers'
assisted generation, whose verification pass runs the target on k+1 query rows where plain
decoding runs one. Both go through the one generate call (replay.generate) with an Assist,
which returns the target's raw logits of every generated token: for a speculative run the
row of the verification pass that produced the accepted token. So each step's logprob bits,
top-5 and margin are measured the same way in both (a logits processor would also see the
rejected positions, and a draft model's own steps).

Each stream adds its verification rounds (`drafted` and `accepted` tokens per round, each
step's `round`), `acceptance_rate` (accepted / drafted), `seconds` and `tokens_per_s`.
transformers runs assisted decoding at batch size 1 only, so every condition is batch size 1.

With --compile both decode on transformers' compiled static-cache path (probes/core/compiled.py; its
assisted decoding runs the verification passes through the compiled forward). A verification pass
has 1 to k+1 query rows, each a shape of its own, so the warm-up is the whole call, timed apart (twice
on CUDA, where the second call was still 1.8-2.6x slower: compiled.SPECULATIVE_WARM_CALLS).
Every round crops the target's static cache back to the accepted tokens; a model with a sliding-window
layer whose static cache is longer than the window cannot be cropped (static_caches.py), so --compile
refuses it in open(), before any condition; a draft model's static cache likewise, where that draft
keeps transformers' own eager assistant instead. Before transformers 5.24 assisted generation takes no
static cache at all: probe.validate_config refuses --compile before the model loads
(static_caches.refuse_compiled_speculation).
"""

import contextlib
import time
from dataclasses import replace

from nondet.errors import ModelLoadError, UnsupportedModelError, UsageError
from nondet.probes.core.batch import Batch, tokenize_inputs
from nondet.probes.core.kernels_mode import COMPILED_CALLS, kernels_mode
from nondet.probes.core.numerics import fingerprint
from nondet.probes.core.pieces import token_piece
from nondet.probes.core.recorder import step_record
from nondet.probes.core.replay import (Assist, DecodeSettings, assisted_cache_len, eos_ids, finish_reason, generate,
                                      truncate_at_eos)
from nondet.probes.core.source import Emit, Opened, Planned
from nondet.probes.core.source import step_record as to_step_record
from nondet.probes.core.static_caches import Uncroppable, uncroppable_layer
from nondet.probes.core.summarize import as_summary, summarize_modes
from nondet.probes.models.loading import ModelSpec, load_model
from nondet.probes.speculative.compiled_draft import overriding, static_drafts
from nondet.probes.speculative.speculation import Speculation, parse_speculative
from nondet.probes.speculative.summary import speculative_section
from nondet.rundir.records import ConditionRecord, StreamRecord


class SpeculativeSource:
    kind = "speculative"

    def __init__(self, config, loaded=None) -> None:
        self.config = config  # ProbeConfig with speculative forms
        self.loaded = loaded  # the target, when already in memory
        self.forms: tuple[Speculation, ...] = parse_speculative(",".join(config.speculative))
        self.drafts: dict[str, object] = {}  # form name -> loaded draft model (draft forms only)
        self.inputs: list[list[int]] = []  # per prompt: the target's token ids
        self.run_ids = 0
        self.paths = None  # --compile: compiled.DecodePaths, set in open() once the device is known
        self.uncroppable_drafts: dict[str, Uncroppable] = {}  # --compile: draft forms whose static cache cannot crop

    def open(self) -> Opened:
        self.loaded = self.loaded or load_model(self.config.model)
        self._refuse_stateful_target()
        self.drafts = {f.name: self._load_draft(f) for f in self.forms if f.kind == "draft"}
        self.inputs = [tokenize_inputs(self.loaded.tokenizer, p, ())[0] for p in self.config.targets]
        found = fingerprint(self.loaded.description, ",".join(self.config.kernels))
        found["speculative"] = {"forms": [f.name for f in self.forms],
                                "drafts": {n: d.description for n, d in self.drafts.items()}}
        found["decode_path"] = "eager, dynamic KV cache"
        if self.config.compile_backend:
            from nondet.probes.core.compiled import DecodePaths, label

            self.paths = DecodePaths(self.config.compile_backend, self.loaded.model.device.type)
            found["decode_path"] = label(self.paths.backend, self.paths.device_type)
            self._refuse_uncroppable_target()
            self.uncroppable_drafts = self._uncroppable_drafts()
        found["speculative"]["draft_decode"] = {f.name: self._draft_path(f) for f in self.forms if f.kind != "ngram"}
        if self.drafts:
            found["speculative"]["draft_kernels"] = "the condition's (the mode covers a draft model as it covers the target)"
        return Opened(found)

    def attach(self, writer) -> None:
        pass

    def plan(self) -> list[Planned]:
        several = len(self.config.targets) > 1
        out = []
        for mode in self.config.kernels:
            for k in range(len(self.config.targets)):
                prefix = f"{mode}/p{k}" if several else mode
                label = f"p{k} " if several else ""
                out.append(Planned(f"{prefix}/bs1/ref", f"{label}plain greedy", mode, (k, None)))
                out += [Planned(f"{prefix}/spec/{f.slug}", f"{label}{f.name}", mode, (k, f)) for f in self.forms]
        return out

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        prompt_id, form = planned.plan
        ids = self.inputs[prompt_id]
        traceable = COMPILED_CALLS if self.paths is not None else False
        with (kernels_mode(planned.kernels, self.loaded.model, traceable=traceable,
                           allow_uncovered=self.config.allow_uncovered),
              self._draft_kernels(planned, form)):
            steps, rounds, seconds = self._decode_on_path(planned.kernels, ids, form)
        emit(self._stream(planned, prompt_id, form, ids, steps, rounds, seconds))
        return ConditionRecord(condition_id=planned.condition_id, kernels=planned.kernels, batch_size=1,
                               positions=[0], fillers="none", label=planned.label, load=self.kind,
                               prompt_id=prompt_id, extra={"speculative": form.name if form else None})

    def _draft_kernels(self, planned: Planned, form: Speculation | None):
        """The condition's kernels on a draft model too: under the mode its attention and experts are
        switched as the target's are (the aten overrides and the traced mode already reach it), as a serving
        engine's deterministic mode covers its draft; before, the draft kept SDPA under the mode. The
        target's tokens never depend on it (the verification pass decides them), only which drafts are
        proposed. (Teacher-forced on the CPU, a damped tiny target and its 2-layer draft agree on 0.88 of
        768 positions with either draft attention: the draft's kernels were not what lowered acceptance.)"""
        if form is None or form.kind != "draft":
            return contextlib.nullcontext()
        try:
            return kernels_mode(planned.kernels, self.drafts[form.name].model,
                                allow_uncovered=self.config.allow_uncovered)  # as the target's: the run is labelled
        except UnsupportedModelError as exc:
            raise UnsupportedModelError(f"--speculative {form.name}: draft model: {exc}") from None

    def summarize(self, streams: list[dict]):
        doc = summarize_modes(streams, self.loaded.tokenizer, self.config.targets)
        doc["speculative"] = speculative_section(streams, [f.name for f in self.forms])
        if self.paths is not None:
            doc["decode_path"] = self.paths.as_summary()
        return as_summary(doc)

    def close(self) -> None:
        self.drafts = {}

    def _decode_on_path(self, mode: str, ids: list[int], form: Speculation | None):
        """_decode eager, or on the compiled path: the whole call as the warm-up (every verification
        shape compiled and captured; twice on CUDA), then the measured call (compiled.DecodePaths)."""
        settings = DecodeSettings(self.config.max_new_tokens, 0.0, self.config.seed)
        if self.paths is None:
            return self._decode(ids, form, settings)
        from nondet.probes.core.compiled import compile_scope, speculative_warm_calls

        compiled = replace(settings, compile_backend=self.config.compile_backend)
        with compile_scope():
            for _ in range(speculative_warm_calls(self.loaded.model.device.type)):
                if self.paths.compiles(mode):
                    self.paths.warm_up(mode, lambda: self._decode(ids, form, compiled))
            started = time.perf_counter()
            decoded = self._decode(ids, form, compiled if self.paths.compiles(mode) else settings)
        self.paths.measured(mode, time.perf_counter() - started)
        return decoded

    def _decode(self, ids: list[int], form: Speculation | None, settings: DecodeSettings):
        """One greedy generate of the prompt alone -> (step dicts, RoundLog, seconds)."""
        model, tokenizer = self.loaded.model, self.loaded.tokenizer
        batch = Batch(input_ids=[ids], attention_mask=[[1] * len(ids)], target_rows=(0,))
        rounds = RoundLog(len(ids), assisted=form is not None)
        with self._assist(form, settings) as assist, rounds.watching(model):
            started = time.perf_counter()
            out = generate(model, tokenizer, batch, settings, None, stopping=[rounds], assist=assist)
            seconds = time.perf_counter() - started
            tokens = out.sequences[0, len(ids):].tolist()
            steps = [step_record(row[:1].float(), t, step=i, row=0, model_dtype=model.dtype)  # batch size 1
                     for i, (row, t) in enumerate(zip(out.logits, tokens))]
        return truncate_at_eos(steps, eos_ids(model, tokenizer)), rounds, seconds

    @contextlib.contextmanager
    def _assist(self, form: Speculation | None, settings: DecodeSettings):
        """The Assist of a form; an assistant's K set on its generation_config for the call. On the
        compiled path a draft model decodes from its own static cache and graphs (compiled_draft.py)."""
        if form is None:  # plain decoding, its static cache as long as the forms' (one shape on the compiled path)
            yield Assist(drafted=max(f.k for f in self.forms))
            return
        if form.kind == "ngram":
            yield Assist(prompt_lookup=form.k, drafted=form.k)
            return
        assistant = self.loaded.model if form.kind == "self" else self.drafts[form.name].model
        compiled_draft = self._compiled_draft(form, settings)
        with drafting(assistant, form.k), (static_drafts(self.loaded.model, form.k) if compiled_draft
                                          else contextlib.nullcontext()):
            yield Assist(assistant=assistant, drafted=form.k)

    def _compiled_draft(self, form: Speculation, settings: DecodeSettings | None) -> bool:
        """Whether a form's draft decodes on the compiled path: a draft model, on a call that decodes
        compiled (settings None: whenever the target does), where transformers' static cache can be
        cropped (no sliding-window layer shorter than the draft's cache; otherwise transformers' own
        eager draft, whose dynamic cache keeps what a crop needs)."""
        compiled = self.paths is not None and (settings is None or settings.compile_backend is not None)
        return form.kind == "draft" and compiled and form.name not in self.uncroppable_drafts

    def _draft_path(self, form: Speculation) -> str:
        """The fingerprint's words for how a form's draft decodes."""
        if self._compiled_draft(form, None):
            return "compiled where the target is, static KV cache (nondet's StaticDraft)"
        layer = self.uncroppable_drafts.get(form.name)
        if layer is not None:
            return (f"eager, dynamic KV cache (transformers' assistant): its layer {layer.index} "
                    f"({layer.layer_type!r}, window {layer.window}) cannot be cropped in a static cache")
        return "eager, dynamic KV cache (transformers' assistant)"

    def _refuse_stateful_target(self) -> None:
        """A model that keeps a recurrent state (hybrid linear attention: Qwen3-Next, Mamba layers) cannot be
        rolled back to the accepted tokens, so transformers refuses assisted generation on it; said here in one
        line before any condition (it was an internal error at the first speculative condition)."""
        if getattr(self.loaded.model, "_is_stateful", False):
            raise UsageError(f"--speculative: {self.loaded.description['name']} keeps a recurrent state "
                             f"({type(self.loaded.model).__name__} is stateful), which transformers' assisted "
                             "generation cannot roll back to the accepted tokens; probe it without --speculative")

    def _refuse_uncroppable_target(self) -> None:
        """--compile: every form's verification rounds crop the target's static cache back; one that
        cannot be cropped (a sliding-window layer shorter than the cache) is refused here, before any
        condition, in one line (transformers would raise at the first verification pass)."""
        k = max(f.k for f in self.forms)
        length = assisted_cache_len(max(map(len, self.inputs)), self.config.max_new_tokens, k)
        layer = uncroppable_layer(self.loaded.model, length)
        if layer is None:
            return
        raise UsageError(f"--speculative with --compile: layer {layer.index} of {self.loaded.description['name']} "
                         f"is a sliding-window attention layer (layer type {layer.layer_type!r}, window "
                         f"{layer.window} tokens, cache {length}); transformers' static cache cannot crop it for "
                         f"the verification pass; rerun without --compile, or with prompt + --max-new-tokens + "
                         f"K + 1 <= {layer.window} tokens")

    def _uncroppable_drafts(self) -> dict[str, Uncroppable]:
        """Draft forms whose StaticDraft cache (prompt + max_new_tokens) could not be cropped back
        (its proposals would attend to rejected drafts): those keep transformers' assistant."""
        length = max(map(len, self.inputs)) + self.config.max_new_tokens
        found = {name: uncroppable_layer(draft.model, length) for name, draft in self.drafts.items()}
        return {name: layer for name, layer in found.items() if layer is not None}

    def _load_draft(self, form: Speculation):
        """The draft model of a draft form; one line (exit 3 / 2) if it cannot load or does not fit."""
        spec = self.config.model
        name = form.model
        if name is None:
            if spec.name is not None:
                raise UsageError(f"--speculative {form.name}: the embedded draft fits only the embedded default "
                                 "model; name a draft of this model's tokenizer: draft:MODEL[:K]")
            from nondet.probes.speculative.default_draft import default_draft_dir

            name = str(default_draft_dir())
        try:
            draft = load_model(ModelSpec(name, spec.dtype, spec.device, spec.attn_implementation,
                                         spec.trust_remote_code))
        except ModelLoadError as exc:
            raise ModelLoadError(f"--speculative {form.name}: draft model: {exc}") from None
        check_vocabulary(form, self.loaded, draft)
        if form.model is None:
            draft.description["name"] = "nondet-default-draft"
        return draft

    def _stream(self, planned: Planned, prompt_id: int, form: Speculation | None, ids: list[int],
                steps: list[dict], rounds: "RoundLog", seconds: float) -> StreamRecord:
        tok = self.loaded.tokenizer
        tokens = [s["token"] for s in steps]
        self.run_ids += 1
        round_of = rounds.round_of_steps()
        records = [to_step_record({**s, "round": round_of[i]} if form else s, token_piece(tok, s["token"]))
                   for i, s in enumerate(steps)]
        extra = {"load": self.kind, "speculative": form.name if form else None, "seconds": round(seconds, 4),
                 "tokens_per_s": round(len(steps) / seconds, 2) if seconds > 0 else None}
        if form:
            extra.update(drafted=rounds.drafted, accepted=rounds.accepted(), acceptance_rate=rounds.rate())
        return StreamRecord(run_id=self.run_ids - 1, condition_id=planned.condition_id, kernels=planned.kernels,
                            position=0, is_reference=form is None, prompt_id=prompt_id, prompt_tokens=len(ids),
                            finish=finish_reason(tokens, eos_ids(self.loaded.model, tok)), text=tok.decode(tokens),
                            steps=records, extra=extra)


def check_vocabulary(form: Speculation, target, draft) -> None:
    """A draft must share the target's tokenizer (assisted decoding compares token ids)."""
    a, b = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    sizes = (target.description.get("vocab"), draft.description.get("vocab"))
    if a != b or sizes[0] != sizes[1]:
        raise UsageError(f"--speculative {form.name}: the draft's vocabulary differs from the target's "
                         f"({len(b)} vs {len(a)} tokens, model vocab {sizes[1]} vs {sizes[0]}); "
                         "a draft must use the target's tokenizer")


@contextlib.contextmanager
def drafting(assistant, k: int):
    """K drafted tokens every round: constant schedule, no confidence cut-off (transformers reads
    these from the assistant's own generation_config); restored after the call."""
    config = assistant.generation_config
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {n: getattr(config, n, None) for n in names}
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
    config.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


class RoundLog:
    """Drafted and produced tokens per verification round, from generate's own calls.

    Each forward's reach (its last position + 1: the verification pass covers context + drafted
    tokens) is noted where generate prepares its inputs; the last forward before the stopping
    criterion (called once per round, after the accepted tokens are appended) is the round's
    verification, also when the target is its own draft. A plain run has one token per round.
    transformers 5.17's assisted decoding also calls the criterion on each round's candidates, before
    the verification pass (its `is_done_candidate`; 5.18 dropped it): an `assisted` log skips that call.
    """

    def __init__(self, prompt_tokens: int, assisted: bool = False) -> None:
        self.length = prompt_tokens  # context length before the current round
        self.skips_candidates = assisted and _checks_candidates()  # 5.17: every odd call is the candidates'
        self.calls = 0
        self.seen: int | None = None  # sequence length the latest target forward reaches
        self.drafted: list[int] = []  # per round: tokens the draft proposed
        self.produced: list[int] = []  # per round: tokens appended (accepted drafts + the target's own)

    @contextlib.contextmanager
    def watching(self, model):
        with overriding(model, "prepare_inputs_for_generation", self._noting(model.prepare_inputs_for_generation)):
            yield self

    def _noting(self, prepare):
        """generate prepares every forward's inputs from the whole sequence so far (in a verification
        pass: context + drafted tokens), so its length is how far the forward reaches. Read there, from a
        shape, outside the compiled forward and without a device sync (a forward pre-hook reading the
        positions ran inside the compiled call: a graph break and a sync in every target forward)."""

        def noting(input_ids, *args, **kwargs):
            self.seen = int(input_ids.shape[-1])
            return prepare(input_ids, *args, **kwargs)

        return noting

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        self.calls += 1
        if not (self.skips_candidates and self.calls % 2):
            new = int(input_ids.shape[-1])
            self.drafted.append(max(0, (self.seen or self.length) - self.length))
            self.produced.append(new - self.length)
            self.length = new
        return torch.zeros((input_ids.shape[0],), dtype=torch.bool, device=input_ids.device)

    def accepted(self) -> list[int]:
        """Per round: drafted tokens the target kept (the round's last token is the target's own)."""
        return [min(d, max(0, p - 1)) for d, p in zip(self.drafted, self.produced)]

    def rate(self) -> float | None:
        drafted = sum(self.drafted)
        return round(sum(self.accepted()) / drafted, 4) if drafted else None

    def round_of_steps(self) -> list[int]:
        return [r for r, n in enumerate(self.produced) for _ in range(n)]


def _checks_candidates() -> bool:
    """Whether transformers' assisted decoding calls the stopping criteria on the candidates too (5.17)."""
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__) < Version("5.18")
