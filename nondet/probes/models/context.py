"""A probe's prompts against the model's context (max_position_embeddings), before the weights load."""

import functools

from nondet.errors import ModelLoadError, UsageError
from nondet.probes.models.load_checks import load_errors, load_failure
from nondet.probes.models.loading import ModelSpec, resolve_source


def check_prompts_fit(spec: ModelSpec, prompts, max_new_tokens: int, chat: bool = False,
                      system: str | None = None, ragged_batch: int = 0) -> None:
    """UsageError when a prompt, with the tokens to generate, is longer than the model's context
    (max_position_embeddings): positions past it were never trained, and a long prompt runs for
    minutes before anything fails. Reads the tokenizer and config only, before the weights load (the
    embedded demo's too: -n 9000 on it decoded past its context; its directory resolved without the
    random demo's note, which the load prints)."""
    from nondet.probes.core.batch import longest_ragged_row
    from nondet.probes.core.chat import model_texts, prompt_ids
    from nondet.probes.models.demo_model import resolve_demo_dir

    source = resolve_source(spec.name) if spec.name is not None else str(resolve_demo_dir(note=False))
    tokenizer, context = _tokenizer_and_context(source, spec.trust_remote_code)
    if context is None:
        return
    for k, text in enumerate(model_texts(tokenizer, prompts, chat, system)):
        n = len(prompt_ids(tokenizer, text))
        which = "the prompt" if len(prompts) == 1 else f"prompt p{k}"
        if n + max_new_tokens > context:
            raise UsageError(_too_long(which, n, max_new_tokens, context))
        longest = longest_ragged_row(n, ragged_batch) if ragged_batch else n
        if longest + max_new_tokens > context:  # --ragged: filler rows up to 2x the prompt share its batch
            raise UsageError(f"with --ragged, a filler row beside {which} ({n} tokens) is {longest} tokens at batch "
                             f"size {ragged_batch}; with --max-new-tokens {max_new_tokens} it reaches "
                             f"{longest + max_new_tokens}, longer than the model's context of {context} tokens; "
                             "drop --ragged, or shorten the prompt or -n")


def _too_long(which: str, n: int, new: int, context: int) -> str:
    limit = f"the model's context of {context} tokens (max_position_embeddings)"
    if n > context:
        return f"{which} is {n} tokens, longer than {limit}; shorten it"
    return (f"{which} is {n} tokens; with --max-new-tokens {new} a request reaches {n + new} tokens, longer than "
            f"{limit}; shorten the prompt or lower --max-new-tokens")


@functools.lru_cache(maxsize=4)  # the gate checks each prompt's probe against the same model
def _tokenizer_and_context(source: str, trust_remote_code: bool):
    """(tokenizer, the model's context length or None) from the model directory or hub id."""
    from transformers import AutoConfig, AutoTokenizer

    from nondet.probes.models.quiet import quiet_loading

    try:
        with quiet_loading():
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
            config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except load_errors() as exc:
        raise ModelLoadError(load_failure(source, exc)) from exc
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return tokenizer, getattr(text_config, "max_position_embeddings", None)
