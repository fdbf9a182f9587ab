"""The draft model on the compiled path: K greedy draft tokens per round from a static cache, the
one- and two-row steps through the draft's compiled forward (CUDA graphs on CUDA).

transformers' assisted generation calls the draft's own `generate` every round, eager, with a dynamic
cache (it switches compile off for the assistant). On the compiled path the target's verification
passes then replay CUDA graphs while every draft step pays generate's set-up and a Python launch per
op: on an H100 (2026-11-25, bench_speculative --case wide --compile, acceptance 88%) speculative
decoding ran at 0.91x of plain decoding under default kernels and 0.53x under the mode, whose eager
ops are Triton launches. A serving engine runs its draft from graphs too; `probe --compile` does the
same for a draft form (`draft:MODEL:K`; `self:K` keeps transformers' generator, since a second cache
on the target's own compiled forward would re-record its graphs).

StaticDraft proposes what transformers' greedy assistant proposes from the same logits: the argmax
after the same logits processors, at most K tokens and none reaching max_length, ending after an
end-of-sequence token. The draft's logits come from its own (compiled) kernels; which tokens it
proposes changes only the round structure, never how the target's logits are measured.

The draft's cache holds the tokens in `fed`. Each round keeps the longest prefix of `fed` that
agrees with the sequence (a crop: the static cache only moves its length back), feeds the rest
(the prompt in the first round, then 1 or 2 tokens: the target's own token, and the last draft when
all were kept) and runs K - 1 one-row steps. A step's logits stay on the device; the round syncs
once, to read its drafts.
"""

import contextlib


def static_drafts(target, k: int):
    """A context in which the target's assisted generation drafts with a StaticDraft (over
    transformers' `_get_candidate_generator`, for this instance only)."""

    def make(*, generation_config, logits_processor, assistant_model, **_):
        return StaticDraft(assistant_model, k, generation_config, logits_processor)

    return overriding(target, "_get_candidate_generator", make)


@contextlib.contextmanager
def overriding(obj, name: str, value):
    """obj.name is `value` on this instance while open; the instance's own attribute, or none, after."""
    own = vars(obj).get(name, _ABSENT)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if own is _ABSENT:
            delattr(obj, name)
        else:
            setattr(obj, name, own)


_ABSENT = object()


class StaticDraft:
    """transformers' CandidateGenerator interface (get_candidates, update_candidate_strategy)."""

    requires_model_outputs = False  # read by transformers' assisted decoding loop

    def __init__(self, draft, k: int, generation_config, logits_processor) -> None:
        from transformers.generation.logits_process import MinLengthLogitsProcessor

        from nondet.probes.core.static_caches import static_cache

        self.draft = draft
        self.k = k
        self.max_length = generation_config.max_length  # the target's: prompt + max_new_tokens
        eos = generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        # as transformers' assistant: the target's processors, less the minimum-length one
        self.processors = [p for p in logits_processor or () if not isinstance(p, MinLengthLogitsProcessor)]
        self.cache = static_cache(draft, 1, self.max_length)  # held: its graphs are recorded once
        self.compiled = draft.get_compiled_call(generation_config.compile_config)
        self.fed: list[int] = []  # token ids whose keys and values the draft's cache holds, in order

    def get_candidates(self, input_ids, **kwargs):
        """(1, L) sequence -> ((1, L + n) sequence with n <= K drafts, None: greedy needs no draft logits)."""
        import torch

        sequence = input_ids[0].tolist()
        budget = min(self.k, self.max_length - len(sequence) - 1)
        if budget <= 0:
            return input_ids, None
        kept = self._keep_agreeing_prefix(sequence)
        drafts, fresh, position = [], input_ids[:, kept:], kept
        for _ in range(budget):
            logits = self._forward(fresh, position)
            position += fresh.shape[1]
            fresh = self._pick(logits, input_ids, drafts)
            drafts.append(fresh)
        proposed = torch.cat(drafts, dim=1)[0].tolist()
        self.fed = sequence + proposed[:-1]  # the last draft was never fed
        proposed = _through_first_eos(proposed, self.eos)
        candidates = torch.tensor([sequence + proposed], dtype=input_ids.dtype, device=input_ids.device)
        # The target's verification pass follows: a new step for cudagraph trees too, so its graph
        # is replayed from the root for its row count, not recorded anew below the draft's last one.
        torch.compiler.cudagraph_mark_step_begin()
        return candidates, None

    def update_candidate_strategy(self, input_ids, scores, num_matches: int) -> None:
        """K stays constant (the probe's schedule); the next round reads what was kept from input_ids."""

    def _keep_agreeing_prefix(self, sequence: list[int]) -> int:
        """Crop the cache to the longest prefix of `fed` equal to the sequence, leaving at least the
        sequence's last token to feed (its logits give the first draft) -> that prefix's length."""
        kept = 0
        limit = min(len(self.fed), len(sequence) - 1)
        while kept < limit and self.fed[kept] == sequence[kept]:
            kept += 1
        if len(self.fed) > kept:
            self.cache.crop(kept - len(self.fed))
        self.fed = self.fed[:kept]
        return kept

    def _forward(self, ids, start: int):
        """Feed ids (1, n) at positions start.. -> the last row's fp32 logits (1, vocab). The first
        feed of a prompt runs eager (one shape per prompt); 1- and 2-row feeds replay graphs."""
        import torch

        positions = torch.arange(start, start + ids.shape[1], device=ids.device).unsqueeze(0)
        call = self.draft
        if start > 0 and ids.shape[1] <= 2:
            call = self.compiled
            torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs are not read again
        out = call(input_ids=ids, position_ids=positions, cache=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].to(torch.float32, copy=True)  # a copy: a graph's output buffer is reused

    def _pick(self, logits, input_ids, drafts):
        """The greedy draft token (1, 1) from logits (1, vocab), after the target's processors."""
        import torch

        if self.processors:
            so_far = torch.cat([input_ids, *drafts], dim=1)
            for processor in self.processors:
                logits = processor(so_far, logits)
        return logits.argmax(dim=-1, keepdim=True)


def _through_first_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """Drafts up to and including the first end-of-sequence token (the assistant stops there)."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens
