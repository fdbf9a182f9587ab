"""The lockstep with TPTap names an all-reduce that makes the batch's sums differ.

One process: a row-parallel all-reduce stood in for by a forward hook on each row-parallel linear
that calls torch.distributed.all_reduce, itself stood in for by a batch-VARIANT sum (the partials
equal, the sum off by a factor for batches over 1): the positive control of the collective point.
The mode keeps every other op class invariant, so only the collective can differ; a world of one
(gloo) sends the mode's invariant all-reduce to the stand-in. With an invariant stand-in the same
lockstep finds nothing (negative control).
"""

import pytest
import torch
import torch.distributed as dist

from nondet.kernels import batch_invariant
from nondet.probes.core.batch import build_batch
from nondet.probes.bisect.lockstep import run_lockstep
from nondet.probes.core.conditions import Condition
from nondet.probes.models.loading import ModelSpec, load_model
from nondet.probes.core.replay import DecodeSettings
from nondet.probes.tp.collective import TPTap, row_parallel_paths


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _lockstep(model_dir, monkeypatch, variant: bool):
    loaded = load_model(ModelSpec(str(model_dir)))
    model, tok = loaded.model, loaded.tokenizer

    def stand_in(t, op=None, group=None, async_op=False):  # the sum of two equal partials
        t.mul_(2)
        if variant and t.shape[0] > 1:
            t.mul_(1 + 2 ** -6)  # what the batch's reduction order would do, made large on purpose

    monkeypatch.setattr(dist, "all_reduce", stand_in)
    for path in row_parallel_paths(model):
        model.get_submodule(path).register_forward_hook(lambda m, args, out: dist.all_reduce(out))
    target = tok("Tell me about Richard Feynman", add_special_tokens=False)["input_ids"]
    fillers = [tok("The quick brown fox jumps over the lazy dog", add_special_tokens=False)["input_ids"]]
    ref = build_batch(Condition("t/bs1/ref", "default", 1, (0,), "none"), target, fillers, tok.pad_token_id)
    div = build_batch(Condition("t/bs4/ends", "default", 4, (0, 3), "same-length"), target, fillers,
                      tok.pad_token_id)
    scope = lambda: batch_invariant(model=model)  # noqa: E731 (every class: only the stand-in can differ)
    return run_lockstep(model, tok, ref, div, DecodeSettings(4, 0.0, 0), scope, row=3, tap=TPTap)


def test_a_batch_variant_all_reduce_is_named_as_the_collective(tiny_model_dir, monkeypatch, world_of_one):
    ls = _lockstep(tiny_model_dir, monkeypatch, variant=True)
    first = ls.first_diff
    assert first is not None
    assert (first["module"], first["op_class"], first["step"]) == (
        "model.layers.0.self_attn.o_proj.all_reduce", "collective", 0)


def test_an_invariant_all_reduce_gives_no_difference(tiny_model_dir, monkeypatch, world_of_one):
    ls = _lockstep(tiny_model_dir, monkeypatch, variant=False)
    assert ls.first_diff is None
    assert ls.reference == ls.divergent
