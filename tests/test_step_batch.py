"""The shapes one traced decode step serves (core/step_batch.py): the batch, the cache's length, and a window
cache's count of tokens seen, symbolic from the first trace."""

import pytest

from nondet.probes.core import step_batch


class _WindowLayer:
    """transformers' sliding-window cache layer as a trace sees it: (B, H, L, D) keys and a Python int it
    advances at every step (DynamicSlidingWindowLayer / StaticSlidingWindowLayer.cumulative_length_int)."""

    def __init__(self, batch: int, seen: int) -> None:
        import torch

        self.keys = torch.zeros(batch, 2, 8, 4)
        self.cumulative_length_int = seen


class _Cache:
    def __init__(self, batch: int, seen: int) -> None:
        self.layers = [_WindowLayer(batch, seen)]


def _step(inputs: dict):
    layer = inputs["cache"].layers[0]
    full = layer.cumulative_length_int >= 8  # the layer's is-full branch
    layer.cumulative_length_int += 1
    return inputs["input_ids"] * 2 + (layer.keys.sum() if full else 1)


def _traces(monkeypatch, window_ints: tuple) -> int:
    """Graphs dynamo traces for three steps of a window cache that has seen 3, 4 and 5 tokens."""
    import torch

    monkeypatch.setattr(step_batch, "WINDOW_LENGTH_INTS", window_ints)
    torch._dynamo.reset()
    counts = {"frames": 0}

    def counting(gm, example_inputs):
        counts["frames"] += 1
        return gm.forward

    compiled = torch.compile(_step, backend=counting)
    for seen in (3, 4, 5):
        inputs = {"input_ids": torch.ones(2, 1, dtype=torch.long), "cache": _Cache(2, seen)}
        with step_batch.symbolic_shapes(inputs):
            assert torch.equal(compiled(inputs), torch.full((2, 1), 3))
        assert inputs["cache"].layers[0].cumulative_length_int == seen + 1  # the mutation is replayed
    torch._dynamo.reset()
    return counts["frames"]


@pytest.mark.parametrize("window_ints, graphs", [(step_batch.WINDOW_LENGTH_INTS, 1), ((), 2)])
def test_a_window_caches_token_count_is_symbolic_from_the_first_trace(monkeypatch, window_ints, graphs):
    """One graph for every step (the count symbolic, guarded only by the is-full branch). Control: without it
    dynamo specialises the count on the first trace (== 3) and traces again at the next step, where a saved
    step was refused and its mode split (a tiny Gemma2 and gpt-oss, 2026-11-28)."""
    assert _traces(monkeypatch, window_ints) == graphs


def test_the_users_own_dynamic_sources_are_kept():
    import torch

    with torch.compiler.config.patch(dynamic_sources="L['x']"):
        with step_batch.symbolic_shapes({"input_ids": torch.ones(1, 1)}):
            assert torch.compiler.config.dynamic_sources.split(",")[0] == "L['x']"
            assert any("cumulative_length_int" in s for s in torch.compiler.config.dynamic_sources.split(","))
        assert torch.compiler.config.dynamic_sources == "L['x']"  # restored


def _cache_length_traces(lengths: bool) -> int:
    """Graphs dynamo traces for steps on caches of key length 8, 9 and 10 (three prompts' static caches), the
    same cache tensors marked with the length symbolic first (as a failed symbolic trace leaves them)."""
    import torch

    torch._dynamo.reset()
    counts = {"frames": 0}

    def counting(gm, example_inputs):
        counts["frames"] += 1
        return gm.forward

    compiled = torch.compile(lambda inputs: inputs["cache"].layers[0].keys.sum(2) + inputs["input_ids"],
                             backend=counting)
    for length in (8, 9, 10):
        cache = _Cache(2, 0)
        cache.layers[0].keys = torch.zeros(2, 2, length, 4)
        inputs = {"input_ids": torch.ones(2, 1), "cache": cache}
        with step_batch.symbolic_shapes(inputs):  # marked, as the symbolic trace did
            pass
        with step_batch.symbolic_shapes(inputs, lengths=lengths):
            compiled(inputs)
    torch._dynamo.reset()
    return counts["frames"]


def test_the_key_length_fixed_traces_per_length_and_symbolic_once():
    """lengths=False, the fallback where a trace with the key length symbolic fails: the length is
    specialised (the marks of the earlier symbolic attempt taken off), so the second length traces again (the
    third is dynamo's own automatic dynamic: two lengths seen); with lengths (the control) one graph serves all
    three, as it would without the marks taken off."""
    assert _cache_length_traces(lengths=True) == 1
    assert _cache_length_traces(lengths=False) == 2


def _traces_for_both_mask_orders(walk) -> int:
    """Graphs dynamo traces for a step that walks its inputs with `walk`, called with the dict of masks per
    attention kind in one key order, then the other (transformers' order varies between processes)."""
    import torch

    torch._dynamo.reset()
    counts = {"frames": 0}

    def counting(gm, example_inputs):
        counts["frames"] += 1
        return gm.forward

    def step(inputs):
        walk(inputs)
        return inputs["attention_mask"]["full_attention"].float().sum() + inputs["input_ids"]

    compiled = torch.compile(step, backend=counting, fullgraph=True)
    full, sliding = torch.ones(2, 1, 1, 8, dtype=torch.bool), torch.ones(2, 1, 1, 8, dtype=torch.bool)
    for masks in ({"full_attention": full, "sliding_attention": sliding},
                  {"sliding_attention": sliding, "full_attention": full}):
        compiled({"input_ids": torch.ones(2, 1), "attention_mask": masks, "cache": _Cache(2, 0)})
    torch._dynamo.reset()
    return counts["frames"]


def test_the_key_length_check_does_not_guard_on_the_masks_order():
    """at_least_two_keys reads every mask: in the dict's own order a saved Gemma2 step was refused by the next
    process (its guard: the first key == 'full_attention'). Control: a walk in the dict's order traces twice."""
    import torch

    assert _traces_for_both_mask_orders(step_batch.at_least_two_keys) == 1

    def in_dict_order(inputs):
        for mask in inputs["attention_mask"].values():
            torch._check(mask.shape[3] >= 2)

    assert _traces_for_both_mask_orders(in_dict_order) == 2
