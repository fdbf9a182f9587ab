"""The shapes a decode step's inputs vary in across a probe, as transformers' compiled generate passes them
(keyword tensors, a dict of masks per attention kind, a static cache): the batch, and the KV cache's length
(each prompt's static cache has its own). A trace in which both are symbolic from the first call lets one
traced graph serve every condition of a probe.

Used by the saved steps (precompiled.py) and by the JIT path of tensor-parallel ranks (dynamic_jit.py).
"""

import contextlib

# Python ints a cache layer advances at every step: transformers' sliding-window layer counts the tokens it has
# seen in `cumulative_length_int` (an int keeps its is-full branch free of data-dependent control flow).
# dynamo specialises an int on its first trace ("== 10"), so a saved step traced at one step was refused at
# the next and traced again with the int symbolic: on a tiny Gemma2 and gpt-oss (CPU, torch 2.13, 2026-11-28)
# the default kernels traced 3 functions where 2 serve every batch size and step.
WINDOW_LENGTH_INTS = ("cumulative_length_int",)


def batch_size(inputs: dict) -> int:
    ids = inputs.get("input_ids")
    if ids is None:
        ids = inputs.get("inputs_embeds")
    return int(ids.shape[0])


def caches(inputs: dict) -> list:
    """The KV caches among the inputs (objects with layers)."""
    return [v for v in inputs.values() if hasattr(v, "layers")]


def batch_tensors(inputs: dict, batch: int) -> list:
    """The input tensors whose first dimension is the batch: the inputs' and the masks' (a dict per attention
    kind). A batch-led tensor has 2 dimensions or more ((B, T) ids and positions, (B, 1, T, K) masks):
    cache_position, (T,), is left out, also where T == B == 1."""
    return _batch_led(_tensors_in_key_order(inputs), batch)


def cache_tensors(inputs: dict, batch: int) -> list:
    """The batch-led tensors of the KV caches' layers ((B, H, L, D) keys and values)."""
    return _batch_led([t for cache in caches(inputs) for layer in cache.layers for t in vars(layer).values()], batch)


def _batch_led(values: list, batch: int) -> list:
    import torch

    return [t for t in values if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[0] == batch]


@contextlib.contextmanager
def symbolic_shapes(inputs: dict, with_caches: bool = True, lengths: bool = True):
    """Inside: a trace of a call on `inputs` keeps their batch dimension symbolic (maybe_mark_dynamic: torch
    finds the tensors' batch sizes equal to each other, a relation mark_dynamic refuses) and size-oblivious
    (backed_size_oblivious: a batch of 1 is not specialised, as dynamo otherwise does), and (lengths) the key
    length of the masks ((B, 1, T, L): dim 3) and of the caches' layers ((B, H, L, D): dim 2); a window
    cache's fixed length is specialised as before, the count of tokens it has seen (a Python int:
    WINDOW_LENGTH_INTS) is symbolic. Without `lengths` the key length is specialised (its marks from an
    earlier trace taken off): the fallback where a trace with it symbolic fails (precompiled.py). Outside a
    trace it only marks the tensors (dynamo reads the marks when it traces). A mark stays on its tensor: a
    held cache marked once (with_caches) need not be walked again at every step."""
    import torch

    batch = batch_size(inputs)
    layers = cache_tensors(inputs, batch) if with_caches else []
    for tensors, length_dim in ((batch_tensors(inputs, batch), 3), (layers, 2)):
        for tensor in tensors:
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
            if tensor.dim() == 4 and lengths:
                torch._dynamo.maybe_mark_dynamic(tensor, length_dim)
            elif tensor.dim() == 4:
                _unmark(tensor, length_dim)
    compiler = torch.compiler.config
    sources = _with_window_lengths(compiler.dynamic_sources) if lengths else compiler.dynamic_sources
    with _setting(torch.fx.experimental._config, "backed_size_oblivious", True), \
            _setting(compiler, "dynamic_sources", sources):
        yield


def at_least_two_keys(inputs: dict) -> None:
    """Inside a traced decode step: tells the trace that every key length among the inputs (the masks' (B, 1, T, L)
    and the caches' layers' (B, H, L, D)) is 2 or more, as a decode step's is (the past and the new token). Under
    symbolic_shapes' backed_size_oblivious a symbolic length's range starts at 0, and Inductor could not prove a
    loop over batch x mask length splits into the two: on an H200 (torch 2.11) the mode's step for batch 2+ failed
    its compile, "CantSplit: s32 not divisible by s1*s32" (tests/test_attention_inputs_traced.py). A length known
    to be >= 2 makes the split provable. On a fixed length the check is a Python comparison, true."""
    import torch

    for mask in [t for t in _tensors_in_key_order(inputs) if t.dim() == 4]:  # (B, 1, T, L) masks
        torch._check(mask.shape[3] >= 2)
    for cache in caches(inputs):
        for layer in cache.layers:
            keys = getattr(layer, "keys", None)
            if isinstance(keys, torch.Tensor) and keys.dim() == 4:
                torch._check(keys.shape[2] >= 2)


def _tensors_in_key_order(inputs: dict) -> list:
    """The tensors among the inputs and in their dicts (the masks per attention kind), read in sorted key order:
    iterating a dict in a trace guards on its order, and transformers builds the dict of masks in an order that
    varies between processes (a saved Gemma2 step was refused by the next process: "list(dict.keys(...))[0] ==
    'full_attention'"); reading it sorted guards on the keys alone."""
    import torch

    found = []
    for name in sorted(inputs):
        value = inputs[name]
        for item in ([value[kind] for kind in sorted(value)] if isinstance(value, dict) else [value]):
            if isinstance(item, torch.Tensor):
                found.append(item)
    return found


def _unmark(tensor, dim: int) -> None:
    """Take off maybe_mark_dynamic's mark of `dim` (torch keeps it in a set on the tensor; where a torch keeps
    it elsewhere, nothing is done and the dim stays as marked)."""
    marked = getattr(tensor, "_dynamo_weak_dynamic_indices", None)
    if isinstance(marked, set):
        marked.discard(dim)


@contextlib.contextmanager
def _setting(config, name: str, value):
    """One torch config entry set inside, restored after: what config.patch does, without the class it
    defines at every call (the TP ranks enter this at every decode step: 106 -> 17 us for both entries on a
    2-core AVX2 CPU)."""
    held = getattr(config, name)
    setattr(config, name, value)
    try:
        yield
    finally:
        setattr(config, name, held)


def _with_window_lengths(sources: str) -> str:
    """torch's list of sources traced as symbolic (names or regexes matched at the start, comma-separated)
    and every cache layer's WINDOW_LENGTH_INTS, whatever the path to the cache (a saved step's
    L['inputs'][...], transformers' own compiled call's L['kwargs'][...])."""
    return ",".join([s for s in sources.split(",") if s] + [rf".*\.{name}$" for name in WINDOW_LENGTH_INTS])
