"""The prefill axis: the prompt's KV cache built in pieces instead of one pass.

A server does not always prefill a prompt in one forward:
- prefix cache: an earlier request that shared the first L tokens left their KV cache behind
  (a "warm" prefix); the target's prefill then computes only the rest, on top of that cache.
  A cold cache computes the whole prompt at once. (vLLM, SGLang, llama.cpp all reuse prefixes.)
- chunked prefill: the scheduler's token budget cuts a long prompt's prefill into chunks of C
  tokens, each one forward on top of the cache the chunks before it left.
In exact arithmetic every split gives the same numbers; in floating point a matmul sees fewer
rows per call and attention sees its keys split between the cache and the call, so a kernel
whose reduction depends on either changes the bits of the positions after the split.

A form is one way of splitting ("prefix:12", "chunk:8"); its `splits` are the token offsets
where one forward ends and the next begins. Every split but the last leaves at least one
token for the generate call itself (which computes the first new token's logits), so every
form decodes through the probe's one generate call (replay.generate) like any other condition.
"""

from dataclasses import dataclass

from nondet.errors import UsageError

KINDS = ("prefix", "chunk")
AUTO = "auto"
# --prefix-cache auto: the prefix cached at these fractions of the prompt (a short shared system
# prompt, half, most of it); --chunked-prefill auto: chunks of these fractions (several forwards each)
AUTO_FRACTIONS = {"prefix": (0.25, 0.5, 0.75), "chunk": (0.125, 0.25, 0.5)}


@dataclass(frozen=True)
class PrefillForm:
    kind: str  # "prefix" | "chunk"
    size: int  # tokens: the cached prefix's length, or one chunk's; 0 = auto (sizes from the prompt's length)

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.size or AUTO}"

    def sizes(self, n_tokens: int) -> tuple[int, ...]:
        """The sizes this form runs for a prompt of n_tokens (auto: the fractions, deduplicated)."""
        if self.size:
            return (self.size,)
        found = (max(1, round(f * n_tokens)) for f in AUTO_FRACTIONS[self.kind])
        return tuple(dict.fromkeys(s for s in found if s < n_tokens))


def splits(kind: str, size: int, n_tokens: int) -> tuple[int, ...]:
    """Token offsets where a prefill of n_tokens is cut: a prefix of `size` -> (size,); chunks of
    `size` -> (size, 2 size, ...) below n_tokens. The generate call computes the last piece."""
    if not 0 < size < n_tokens:
        return ()
    if kind == "prefix":
        return (size,)
    return tuple(range(size, n_tokens, size))


def label(kind: str, size: int) -> str:
    return f"prefix {size} cached" if kind == "prefix" else f"prefill in chunks of {size}"


def parse_prefill(prefix_cache: str | None, chunked_prefill: str | None) -> tuple[str, ...]:
    """--prefix-cache / --chunked-prefill as typed ('12,24', 'auto') -> form names ('prefix:12', ...)."""
    forms: list[str] = []
    for kind, text, flag in (("prefix", prefix_cache, "--prefix-cache"), ("chunk", chunked_prefill,
                                                                        "--chunked-prefill")):
        if text is None:
            continue
        forms += [f"{kind}:{size or AUTO}" for size in _sizes(text, flag)]
    return tuple(dict.fromkeys(forms))


def _sizes(text: str, flag: str) -> list[int]:
    """'auto' -> [0]; '4,8,16' -> [4, 8, 16]; anything else a one-line usage error."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if parts == [AUTO]:
        return [0]
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise UsageError(f"{flag}: give token counts >= 1 like 8,16,32, or auto; not {text!r}")
    return sizes


def as_forms(names: tuple[str, ...]) -> tuple[PrefillForm, ...]:
    """Form names from a config ('prefix:12', 'chunk:auto') -> PrefillForms."""
    forms = []
    for name in names:
        kind, _, size = name.partition(":")
        if kind not in KINDS or not (size == AUTO or size.isdigit() and int(size) > 0):
            raise UsageError(f"prefill form {name!r}: expected prefix:N, chunk:N or prefix:auto / chunk:auto")
        forms.append(PrefillForm(kind, 0 if size == AUTO else int(size)))
    return tuple(forms)


def cached_pieces(model, input_ids, attention_mask, cuts: tuple[int, ...]):
    """The KV cache of every piece before the last cut, each piece one forward on top of the cache
    the pieces before it left (the model's own cache class: a hybrid keeps its recurrent state).
    input_ids, attention_mask: [batch, seq] tensors on the model's device. Returns the cache for
    generate, which computes input_ids[:, cuts[-1]:] on top of it."""
    import inspect

    import torch

    from nondet.kernels.hf_names import cache_kwarg, output_cache

    # as generate's own prefill: only the last position's logits (the rest would be computed and dropped)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    cache = None
    bounds = (0, *cuts)
    for start, end in zip(bounds, bounds[1:]):
        positions = torch.arange(start, end, device=input_ids.device)
        out = model(input_ids=input_ids[:, start:end], attention_mask=attention_mask[:, :end],
                    use_cache=True, cache_position=positions, **{cache_kwarg(model): cache}, **keep)
        cache = output_cache(out)
    return cache
