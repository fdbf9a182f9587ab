"""One condition = one batched `model.generate` call; returns the target rows' streams.

`generate` is the only place nondet calls `model.generate` on a batch: the probe calls it
through `generate_condition`, bisect's lockstep replay calls it with its hooks and forced
tokens passed in, so the replay runs exactly as the probe did; the speculative source calls
it with an `Assist` (plain greedy and assisted decoding through the same call).
"""

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Sequence

from nondet.errors import OutOfMemoryError, is_out_of_memory
from nondet.probes.core.batch import Batch, build_batch
from nondet.probes.core.conditions import Condition
from nondet.probes.core.deferred_stop import deferred_stop_check, defers_stop
from nondet.probes.core.generation_defaults import without_model_defaults
from nondet.probes.core.kernels_mode import COMPILED_CALLS, kernels_mode
from nondet.probes.core.recorder import StepRecorder
from nondet.probes.core.routing_trace import RoutingTrace
from nondet.probes.core.settled import StopRule, mark_stopped, settled_criterion


KV_CACHES = ("dynamic", "static")
Settle = tuple[StopRule, dict[int, list[dict]]]  # --fail-fast: the rule and each target row's reference steps


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int
    temperature: float  # 0 = greedy
    seed: int  # seeds each request's own generator when sampling
    # dynamic: transformers' default cache, attention spans the tokens so far; static: a
    # preallocated cache of prompt + max_new_tokens positions (the layout CUDA graphs need),
    # attention spans all of it under a mask. Never compiled here: transformers would
    # auto-compile a static cache on CUDA, and a compiled model may pick other kernels.
    kv_cache: str = "dynamic"
    # the compiled path (probes/core/compiled.py): torch.compile backend of transformers' compiled decode
    # with a static cache (kv_cache is then ignored); None = eager
    compile_backend: str | None = None
    # eager kernels, a static cache, each decode step replayed from a CUDA graph recorded once per batch shape
    # (probes/core/captured.py; kv_cache is then ignored); never with compile_backend
    cuda_graphs: bool = False
    # with batch-invariant kernels, run a model whose op census finds uncovered ops (partly invariant)
    allow_uncovered: bool = False
    # when sampling: per-request (each request its own generator) | shared (one for the batch; recorder.py)
    sampler: str = "per-request"
    # new-token positions a static cache holds where the call decodes fewer (bisect replays a probe's static,
    # compiled or CUDA-graph run up to its flip: the cache keeps the probe's length, stop_after.py);
    # None: max_new_tokens
    cache_tokens: int | None = None


def generate_condition(model, tokenizer, batch: Batch, settings: DecodeSettings,
                       settle: Settle | None = None) -> dict[int, list[dict]]:
    """Run generate on the batch; {target row: [step record, ...]} truncated after EOS.
    settle: (rule, {target row: its reference's steps}): the call stops once every row's verdict is settled
    (--fail-fast, core/settled.py), its cut rows marked."""
    recorder = new_recorder(batch, settings, getattr(model, "dtype", None))
    trace = RoutingTrace(model, batch.target_rows, len(batch.input_ids))
    criterion = settled_criterion(*settle, recorder) if settle else None
    with trace:  # a mixture of experts: each target token's experts, per step (nothing on a dense model)
        generate(model, tokenizer, batch, settings, recorder, stopping=[criterion] if criterion else ())
    steps_of = recorder.steps
    if trace.found:
        for row, experts in trace.experts().items():
            # the prefill axis's earlier pieces are forward calls of their own, before generate's prefill
            for step, ids in zip(steps_of[row], experts[len(batch.splits):]):
                step["experts"] = ids
    eos = eos_ids(model, tokenizer)
    rows = {row: truncate_at_eos(steps, eos) for row, steps in steps_of.items()}
    return mark_stopped(rows, settings.max_new_tokens, eos) if criterion and criterion.fired else rows


def new_recorder(batch: Batch, settings: DecodeSettings, model_dtype=None) -> StepRecorder:
    """The recorder of the batch's target rows (each target samples with the same seed); model_dtype: named in
    the message of logits that are not finite."""
    return StepRecorder(batch.target_rows, len(batch.input_ids), settings.temperature, settings.seed,
                        sampler=settings.sampler, model_dtype=model_dtype)


@dataclass(frozen=True)
class Assist:
    """Speculative decoding inside the generate call (transformers' assisted generation).

    With an Assist the call returns the target's raw logits of every generated token
    (`output_logits`): for an accepted token, its row of the verification pass. A recorder
    would not do there: transformers calls logits processors on rejected positions too.
    """

    prompt_lookup: int | None = None  # prompt_lookup_num_tokens: K tokens drafted from n-gram matches
    assistant: object = None  # the draft model (the target itself for self:K); K is set on its generation_config
    drafted: int = 0  # K: a verification pass may write K positions past the last kept token

    def kwargs(self) -> tuple[dict, dict]:
        """(GenerationConfig fields, generate() arguments)."""
        if self.assistant is not None:
            return {}, {"assistant_model": self.assistant}
        return {"prompt_lookup_num_tokens": self.prompt_lookup}, {}


def generate(model, tokenizer, batch: Batch, settings: DecodeSettings, recorder: StepRecorder | None,
             after: Sequence = (), stopping: Sequence = (), assist: Assist | None = None):
    """The one `model.generate` call of a condition: the probe's, bisect's lockstep replay, and
    the speculative source's (plain and assisted, `assist`).

    `batch.splits` (the prefill axis): the prompt's pieces before the last cut are prefilled first
    (core/prefill.py), and generate computes the rest on top of their KV cache.
    `after`: logits processors run after the recorder (bisect forces the reference's tokens);
    `stopping`: extra stopping criteria. Neither changes the numerics of what the recorder saw.
    `assist`: speculative decoding; the call then returns generate's output with `logits`
    (also for a plain run given `Assist()`, so both are measured the same way).
    """
    import torch
    from transformers import LogitsProcessorList, StoppingCriteriaList

    device = model.device
    fields, arguments = assist.kwargs() if assist and (assist.prompt_lookup or assist.assistant) else ({}, {})
    cache_fields = _cache_fields(settings, model, len(batch.input_ids[0]), assist.drafted if assist else 0)
    settings, stopping = _cache_length(settings, cache_fields, len(batch.input_ids[0]), stopping)
    _install_steps(model, settings, cache_fields, assisted=assist is not None)
    input_ids = torch.tensor(batch.input_ids, device=device)
    attention_mask = torch.tensor(batch.attention_mask, device=device)
    try:
        with torch.inference_mode():  # a held static cache is reset in here: its tensors are inference tensors
            arguments.update(_held_cache(model, batch, settings, cache_fields))
            if cache_fields.get("cache_implementation") == "static":  # generate builds this call's static cache
                _own_length(model)
            if batch.splits:  # the prefill axis: the pieces before the last cut prefilled first, in order
                from nondet.kernels.hf_names import cache_kwarg
                from nondet.probes.core.prefill import cached_pieces

                arguments[cache_kwarg(model)] = cached_pieces(model, input_ids, attention_mask, batch.splits)
            config = _generation_config(model, tokenizer, settings, assist is not None, {**cache_fields, **fields})
            # the probe's own calls read the stop flag a step late on CUDA; calls with processors or
            # criteria of their own (bisect's forcing, warm-up, speculative rounds) keep the per-step wait,
            # since those would see the extra step generate undoes
            defer = defers_stop(device, assisted=assist is not None) and not after and not stopping
            with deferred_stop_check(defer) as deferred, without_model_defaults(model):
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    generation_config=config,
                    logits_processor=LogitsProcessorList([p for p in (recorder, *after) if p is not None]),
                    stopping_criteria=StoppingCriteriaList(stopping),
                    **arguments,
                )
            if deferred and recorder is not None:  # a step generate ran and undid is not in what it returned
                recorder.keep_first(_sequences(out).shape[-1] - input_ids.shape[-1])
            return out
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError; on CPU a plain one
        if not is_out_of_memory(exc):
            raise
        raise OutOfMemoryError(f"out of memory at batch size {len(batch.input_ids)} on {device}; "
                               "lower --batch-sizes or --max-new-tokens") from exc


def _cache_length(settings: DecodeSettings, cache_fields: dict, prompt_len: int,
                  stopping: Sequence) -> tuple[DecodeSettings, Sequence]:
    """A static cache of settings.cache_tokens new positions where the call decodes fewer: the settings'
    max_new_tokens raised to it (what sizes the cache), and a criterion stopping at the call's own count."""
    static = cache_fields.get("cache_implementation") == "static"  # eager static, compiled and CUDA-graph paths
    if not static or not settings.cache_tokens or settings.cache_tokens <= settings.max_new_tokens:
        return settings, stopping
    from dataclasses import replace

    from nondet.probes.core.stop_after import stop_after

    return (replace(settings, max_new_tokens=settings.cache_tokens),
            [*stopping, stop_after(prompt_len, settings.max_new_tokens)])


def _generation_config(model, tokenizer, settings: DecodeSettings, assisted: bool, fields: dict):
    """Greedy for generate (a sampled token is chosen by the recorder per request), the settings'
    length, the model's EOS; `fields`: the cache, decode-path and assistant fields."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False,
        max_new_tokens=settings.max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos_ids(model, tokenizer) or None,
        return_dict_in_generate=assisted,  # the speculative source reads the raw logits
        output_logits=assisted,
        **fields,
    )


def _sequences(out):
    """generate's token ids [rows, prompt + generated], from its output (a tensor, or a dict with
    return_dict_in_generate)."""
    return out if hasattr(out, "shape") else out.sequences


def _cache_fields(settings: DecodeSettings, model, prompt_len: int, drafted: int) -> dict:
    """GenerationConfig fields of the KV cache kind and the decode path (see DecodeSettings). A
    static cache holds max_length positions; speculative decoding's last verification pass may
    write `drafted` + 1 more (drafts past the end are cut only after they are verified)."""
    if settings.cuda_graphs:
        from nondet.probes.core.captured import generation_fields

        return generation_fields()
    if settings.compile_backend:
        from nondet.probes.core.compiled import generation_fields, tp_layout_guard_filter

        fields = generation_fields(settings.compile_backend, model.device.type, tp_layout_guard_filter(model))
        if drafted:
            fields["max_cache_len"] = assisted_cache_len(prompt_len, settings.max_new_tokens, drafted)
        return fields
    if settings.kv_cache == "static":
        return {"cache_implementation": "static", "disable_compile": True}
    return {}


def _install_steps(model, settings: DecodeSettings, cache_fields: dict, assisted: bool) -> None:
    """What transformers' generate calls for a decode step: the recorded CUDA graphs (captured.py), the
    compiled path's steps, or (eager) the model itself, with neither of the others left on the model."""
    from nondet.probes.core import captured

    if settings.cuda_graphs:
        captured.install(model, cache_fields["compile_config"])
        return
    captured.uninstall(model)
    if settings.compile_backend:
        _precompiled_steps(model, cache_fields["compile_config"], assisted)


def _precompiled_steps(model, compile_config, assisted: bool) -> None:
    """The compiled decode step from functions saved under NONDET_CACHE (core/precompiled.py), not traced
    again in every process; with NONDET_PRECOMPILE=jit (set in every tensor-parallel rank: all degrees,
    TP1 too, decode on one path) transformers' JIT compile with the batch symbolic (core/dynamic_jit.py);
    transformers' own JIT compile for speculative calls or with NONDET_PRECOMPILE=0."""
    from nondet.probes.core import dynamic_jit, precompiled
    from nondet.probes.core.cache_dir import cache_root

    saved, symbolic = not assisted and precompiled.enabled(), not assisted and precompiled.symbolic_jit()
    if saved:  # install() keeps the model's own object from call to call: what it loaded stays loaded
        precompiled.install(model, compile_config, cache_root() / "precompiled")
    else:
        precompiled.uninstall(model)
    if symbolic:
        dynamic_jit.install(model, compile_config)
    else:
        dynamic_jit.uninstall(model)


def assisted_cache_len(prompt_len: int, max_new_tokens: int, drafted: int) -> int:
    """Positions of a speculative call's static cache: max_length, and the `drafted` + 1 rows the last
    verification pass may write past it."""
    return prompt_len + max_new_tokens + drafted + 1


def _held_cache(model, batch: Batch, settings: DecodeSettings, fields: dict) -> dict:
    """On a static cache (eager, compiled or from CUDA graphs), the generate() arguments that hand it the model's
    held static cache of this call's own length (static_caches.py: the compiled path's and the CUDA-graph path's
    graphs are recorded once, not per call), taking the cache fields out of `fields`; {} elsewhere, and before
    transformers 5.24, which takes no cache there (_own_length)."""
    from nondet.probes.core.static_caches import reusable_static_cache, static_cache

    if fields.get("cache_implementation") != "static" or not reusable_static_cache():
        return {}
    length = fields.pop("max_cache_len", len(batch.input_ids[0]) + settings.max_new_tokens)
    del fields["cache_implementation"]
    return {"cache": static_cache(model, len(batch.input_ids), length)}


def _own_length(model) -> None:
    """transformers sizes a static cache it builds to the longest any earlier generate call on the model asked for
    (`_previous_max_cache_length`, which spares a compiled model new shapes). A probe's calls must each have their
    own, prompt + new tokens: the masked positions past it can change how the default kernels split their sums, so a
    prompt's numbers would depend on which longer prompts ran before it."""
    model.__dict__.pop("_previous_max_cache_length", None)


def eos_ids(model, tokenizer) -> list[int]:
    """The ids that end a completion: the generation config's, else the tokenizer's (model None: the tokenizer's)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None or eos == []:  # id 0 is an EOS (GPT-NeoX / Pythia, StarCoder, MPT): test None, not falsiness
        eos = tokenizer.eos_token_id
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]


def finish_reason(tokens: list[int], eos: list[int]) -> str:
    """A stream's StreamRecord.finish: "eos" where its last token ends text, "length" where -n cut it, "empty"."""
    if not tokens:
        return "empty"
    return "eos" if tokens[-1] in eos else "length"


def truncate_at_eos(steps: list[dict], eos: list[int]) -> list[dict]:
    """Steps up to and including the first end-of-sequence token."""
    for i, step in enumerate(steps):
        if step["token"] in eos:
            return steps[: i + 1]
    return steps


def replay_condition(model, tokenizer, condition: Condition, target: list[int], fillers: list[list[int]],
                     settings: DecodeSettings, prompts: list[list[int]] | None = None,
                     warm: bool = False, settle: Settle | None = None) -> dict[int, list[dict]]:
    """One condition: build its batch, generate under its kernels; {target row: step dicts}.
    prompts: every prompt's token ids, for a condition with a prompt in each row.
    warm: a warm-up call of the compiled path: the same batch and cache length, stopped after
    compiled.WARM_STEPS decode steps, its records dropped ({}); they are made all the same, so the recorder's
    own kernels (under the mode, the log-softmax over the logits) compile in the warm-up too, and the
    warm-up's time holds every compile the condition needs.
    settle: --fail-fast's rule and references (generate_condition)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch = build_batch(condition, target, fillers, pad_id or 0, prompts)
    with kernels_mode(condition.kernels, model, traceable=COMPILED_CALLS if settings.compile_backend else False,
                      allow_uncovered=settings.allow_uncovered):
        if not warm:
            return generate_condition(model, tokenizer, batch, settings, settle)
        from nondet.probes.core.compiled import warm_up_stop

        stop = warm_up_stop(len(batch.input_ids[0]))
        # the CUDA-graph path records its graphs here: an MoE's routing trace must be in them (captured.keep)
        with RoutingTrace(model, batch.target_rows, len(batch.input_ids)) if settings.cuda_graphs else nullcontext():
            generate(model, tokenizer, batch, settings, new_recorder(batch, settings, getattr(model, "dtype", None)),
                     stopping=[stop])
        return {}
