"""A model's own generation defaults (its generation_config.json) kept out of the probe's generate calls.

transformers fills every GenerationConfig field a call leaves unset from the model's generation_config
(5.x: `_prepare_generation_config`), so an instruct model that ships `repetition_penalty: 1.05` (or
`no_repeat_ngram_size`, `suppress_tokens`, `num_beams`, ...) had its penalty applied to every "greedy"
stream the probe recorded: the recorded logprobs were not the model's, and the RL trainer's (a plain
forward) differed from the sampler's by the penalty, not by any kernel. The probe decodes the model's own
logits: during generate the model's generation_config is a clean one holding only its token ids, and
what it set is named in the fingerprint (`model.generation_defaults_ignored`).
"""

import contextlib

# kept from the model's generation config: its token ids (the probe passes eos / pad itself as well) and the
# draft schedule speculative.source.drafting sets on an assistant, the target itself for self:K (a draft's
# schedule moves its acceptance, never a greedy token)
_KEPT = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "num_assistant_tokens",
         "num_assistant_tokens_schedule", "assistant_confidence_threshold")
# fields whose value changes which token greedy decoding picks, or its logprob (logits processors, beam,
# contrastive and prompt-lookup search); sampling settings (temperature, top_p, ...) are not applied either,
# and change nothing at greedy
CHANGES_TOKENS = ("repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
                  "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id",
                  "min_length", "min_new_tokens", "exponential_decay_length_penalty", "sequence_bias",
                  "guidance_scale", "renormalize_logits", "watermarking_config", "num_beams", "penalty_alpha",
                  "dola_layers", "prompt_lookup_num_tokens")
_NEUTRAL = {"repetition_penalty": 1.0, "num_beams": 1, "guidance_scale": 1.0, "renormalize_logits": False,
            "min_length": 0, "min_new_tokens": 0, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
            "penalty_alpha": 0}


def ignored_defaults(model) -> dict:
    """What the model's generation_config sets that would have changed greedy tokens or their logprobs, and the
    probe does not apply: {field: value}, JSON-ready; {} for most models (neutral values are left out)."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return {}
    return {k: v for k, v in sorted(config.to_diff_dict().items())
            if k in CHANGES_TOKENS and _jsonable(v) and v not in (None, [], {}) and v != _NEUTRAL.get(k, object())}


@contextlib.contextmanager
def without_model_defaults(model):
    """model.generation_config is a clean GenerationConfig (the model's token ids and draft schedule only)
    inside; restored after."""
    from transformers import GenerationConfig

    saved = getattr(model, "generation_config", None)
    if saved is None:
        yield
        return
    kept = {k: getattr(saved, k) for k in _KEPT if getattr(saved, k, None) is not None}
    model.generation_config = GenerationConfig(**kept)
    try:
        yield
    finally:
        model.generation_config = saved


def _jsonable(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, list, dict))
