"""generate's "all rows finished?" check read one step late on CUDA, so the host never waits on the GPU.

transformers' greedy loop reads `unfinished_sequences.max() == 0` on the host after every step: the
host stops until the GPU has finished that step, and only then prepares and launches the next. A
step is then the host's part plus the GPU's part in sequence. transformers (5.17+, our floor) has a
`DeferredStopCheck` that copies the flag asynchronously and reads it on the following step (the
host queues step n + 1 while the GPU runs step n), but enables it on mps only. We allow it on
CUDA for the calls we make; it costs one extra forward when every row stopped early (by EOS or a
stopping criterion), which generate undoes in the tokens it returns. The logits processors still saw
that step, so the recorder keeps only the steps generate returned (`StepRecorder.keep_first`).

The check is handed no cache. Given a cache that outlives generate (one passed in: the compiled
path's held static cache, the prefill axis's pieces), transformers would record its past, crop it
every step (a launch per layer) and roll the extra step back at the end, and would not defer at all
for a cache that cannot be cropped (a sliding window past its length). None of ours is read after
the call without a reset: the held static cache is zeroed before its next use (static_caches.py) and
the pieces' cache is dropped, so the extra step's entries need no rollback.

The numerics do not move: the same forwards in the same order, the host only stops waiting. On an
H200 (2026-11-30, 8B-shaped Qwen3, compiled, the mode) a step went 8.05 -> 5.92 ms at B = 1 and
11.47 -> 7.94 ms at B = 64 with the same logits (docs/benchmarks.md). The CPU has no events (and
no queue to overlap): generate there decodes as before.
"""

import contextlib


def defers_stop(device, assisted: bool) -> bool:
    """Whether a generate call on `device` reads its stop flag a step late: CUDA, not assisted
    (assisted decoding has its own loop, without this check)."""
    return device.type == "cuda" and not assisted


@contextlib.contextmanager
def deferred_stop_check(enabled: bool):
    """While open (when `enabled`): transformers' DeferredStopCheck allowed on the call's device
    (not for an assistant), and handed no cache (the module's docstring says why). Both put back in
    `finally`. A transformers without the class decodes as before."""
    cls = _deferred_check_class() if enabled else None
    if cls is None:
        yield False
        return
    original_supported, original_init = cls.__dict__["is_supported"], cls.__dict__["__init__"]

    def is_supported(device, cache, cache_is_returned, is_assistant=False):
        return not is_assistant

    def without_cache(self, input_ids, max_length, cache, cache_is_returned, streamer=None):
        original_init(self, input_ids, max_length, None, False, streamer)

    cls.is_supported, cls.__init__ = staticmethod(is_supported), without_cache
    try:
        yield True
    finally:
        cls.is_supported, cls.__init__ = original_supported, original_init


def _deferred_check_class():
    from transformers.generation import utils

    return getattr(utils, "DeferredStopCheck", None)
