"""One static KV cache per model and shape, reset and handed to each compiled generate call.

transformers builds a new StaticCache for every generate call. Its tensors are marked as static
addresses, so the CUDA graphs recorded against the previous call's cache do not fit the new one and
cudagraph trees record every shape again, in every call: on an H100 (2026-11-25, the 8B-width
speculative case, gpu_speculative_profile.py of commit ed9edac) a 64-token speculative call spent about 60 ms
more than plain decoding outside the GPU, about one re-recording per shape it replays (the
verification passes of 1..K+1 rows and the draft's 1- and 2-row steps). A server records its graphs
once; reusing the cache does the same here. reset() zeroes the cache, the state a fresh one starts
from, so the bits are those of a fresh cache.

Speculative decoding crops the cache back after each verification pass (the rejected drafts' positions).
A sliding-window layer's static cache (transformers' StaticSlidingWindowLayer) holds only its window:
once the cache is longer than the window, positions a crop would return to have been written over, so
it reports `is_croppable` False (transformers 5.24: max_cache_len <= sliding_window) and assisted
decoding refuses it at its first verification pass. `uncroppable_layer` reads that from the real cache.

Before 5.24 (5.17-5.23, the floor pyproject.toml allows) assisted generation refuses any static cache
("assisted generate is not supported with Static cache classes"), so `--speculative --compile` is
refused up front there (`refuse_compiled_speculation`); plain `--compile` works, on a cache per call.
"""

import weakref
from typing import NamedTuple

from nondet.errors import UsageError

_HELD: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> ((batch, length), StaticCache)
CROPPABLE_SINCE = "5.24"  # the first transformers whose StaticLayer crops, and whose assisted generation takes it


def reusable_static_cache() -> bool:
    """transformers keeps a static cache's length on the device and takes a cache as `cache=` (5.24
    and later: what the reuse and the draft's crops rely on)."""
    from transformers.cache_utils import StaticLayer

    return bool(getattr(StaticLayer, "is_croppable", False))


def refuse_compiled_speculation() -> None:
    """`--speculative --compile` before transformers 5.24: one line (exit 2), before the model loads.
    StaticLayer.is_croppable arrived in 5.24 with assisted generation on a static cache; 5.17-5.23
    raise at the first speculative condition, after the plain reference has compiled."""
    if reusable_static_cache():
        return
    import transformers

    raise UsageError(f"--speculative with --compile needs transformers {CROPPABLE_SINCE} or later (installed "
                     f"{transformers.__version__}: its assisted generation refuses a static cache); "
                     f"pip install 'transformers>={CROPPABLE_SINCE},<6', or rerun without --compile")


class Uncroppable(NamedTuple):
    """A sliding-window layer whose static cache cannot be cropped back."""

    index: int  # in the decoder's layers
    layer_type: str  # transformers' layer type, e.g. 'sliding_attention' (inferred where the config has none)
    window: int  # tokens the layer's cache holds


def uncroppable_layer(model, max_cache_len: int) -> Uncroppable | None:
    """The first sliding-window layer of the model's static cache of this length that `crop` cannot put
    back as it was; None when every one can (5.24 and later: refuse_compiled_speculation comes first).
    Builds the StaticCache generate builds, without tensors (its layers allocate at their first update).
    Only sliding layers: a linear-attention layer knows whether it can crop only after the prefill."""
    from transformers import StaticCache
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = model.config.get_text_config(decoder=True)
    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    types, kwargs = get_layer_types_and_kwargs(config)  # what StaticCache dispatched its layers on
    for index, layer in enumerate(cache.layers):
        if getattr(layer, "is_sliding", False) and not layer.is_croppable:
            return Uncroppable(index, types[index], kwargs[index]["sliding_window"])
    return None


def static_cache(model, batch_size: int, max_cache_len: int):
    """The model's static cache for this batch size and length, reset: one held per model (a new
    shape replaces it, so a probe across batch sizes holds one at a time)."""
    from transformers import StaticCache

    key = (batch_size, max_cache_len)
    held = _HELD.get(model)
    if held is None or held[0] != key:
        held = (key, StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=max_cache_len))
        _HELD[model] = held
    held[1].reset()
    return held[1]
