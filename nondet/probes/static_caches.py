"""One static KV cache per model and shape, reset and handed to each compiled generate call.

transformers builds a new StaticCache for every generate call. Its tensors are marked as static
addresses, so the CUDA graphs recorded against the previous call's cache do not fit the new one and
cudagraph trees record every shape again, in every call: on an H100 (2026-11-25, the 8B-width
speculative case, scripts/gpu_speculative_profile.py) a 64-token speculative call spent about 60 ms
more than plain decoding outside the GPU, about one re-recording per shape it replays (the
verification passes of 1..K+1 rows and the draft's 1- and 2-row steps). A server records its graphs
once; reusing the cache does the same here. reset() zeroes the cache, the state a fresh one starts
from, so the bits are those of a fresh cache.
"""

import weakref

_HELD: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> ((batch, length), StaticCache)


def reusable_static_cache() -> bool:
    """transformers keeps a static cache's length on the device and takes a cache as `cache=` (5.24
    and later: what the reuse and the draft's crops rely on)."""
    from transformers.cache_utils import StaticLayer

    return bool(getattr(StaticLayer, "is_croppable", False))


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
