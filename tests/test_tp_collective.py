"""Without processes: the collective op class, the capture of a row-parallel
linear's all-reduce (partial, then sum), and the mode's invariant all-reduce switch."""

import pytest
import torch
import torch.distributed as dist

from nondet.kernels import batch_invariant, collective
from nondet.probes.bisect import classify as cls
from nondet.probes.tp.collective import CollectiveTap, row_parallel_paths


def test_the_all_reduce_point_is_its_own_op_class():
    assert "collective" in cls.OP_CLASSES
    assert cls.classify("model.layers.2.self_attn.o_proj.all_reduce", torch.nn.Linear(2, 2)) == "collective"
    assert cls.classify("model.layers.2.self_attn.o_proj", torch.nn.Linear(2, 2)) == "matmul"
    assert cls.layer_index("model.layers.2.self_attn.o_proj.all_reduce") == 2


def _tiny_qwen3(layers=2):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    return Qwen3ForCausalLM(cfg).eval()


def test_row_parallel_paths_follow_the_models_tp_plan():
    model = _tiny_qwen3()
    assert row_parallel_paths(model) == ["model.layers.0.self_attn.o_proj", "model.layers.0.mlp.down_proj",
                                         "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.down_proj"]


def test_the_tap_captures_the_partial_then_the_sum(monkeypatch):
    """transformers' row-parallel all-reduce, stood in for by a hook that calls torch.distributed.all_reduce;
    the stand-in doubles in place (the sum of two equal partials)."""
    model = _tiny_qwen3(layers=1)
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None, async_op=False: t.mul_(2))
    for path in row_parallel_paths(model):
        model.get_submodule(path).register_forward_hook(lambda m, args, out: dist.all_reduce(out))
    seen = []
    stand_in = dist.all_reduce
    with CollectiveTap(model, row=1, batch_size=2, step=lambda: 0, sink=lambda s, p, r: seen.append((p, r))):
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    assert dist.all_reduce is stand_in  # put back on exit
    assert [(p.module, p.op_class) for p, _ in seen] == [
        ("model.layers.0.self_attn.o_proj", "matmul"), ("model.layers.0.self_attn.o_proj.all_reduce", "collective"),
        ("model.layers.0.mlp.down_proj", "matmul"), ("model.layers.0.mlp.down_proj.all_reduce", "collective")]
    assert torch.equal(seen[1][1], 2 * seen[0][1]) and seen[0][1].shape == (3, 32)  # row 1: [seq, hidden]


def test_the_mode_switches_the_all_reduce_and_restores_it():
    original = dist.all_reduce
    with batch_invariant():
        assert dist.all_reduce is collective.invariant_all_reduce
        with batch_invariant(ops={"norm"}):
            assert dist.all_reduce is original  # an ablation without matmul / collective
        with batch_invariant(ops={"collective"}):
            assert dist.all_reduce is collective.invariant_all_reduce
        assert dist.all_reduce is collective.invariant_all_reduce
    assert dist.all_reduce is original
    with pytest.raises(RuntimeError, match="boom"):
        with batch_invariant(ops={"collective"}):
            raise RuntimeError("boom")
    assert dist.all_reduce is original and not collective.is_enabled()


def test_rank_order_sum_is_fp32_in_rank_order():
    small = 2.0 ** -8  # half of bf16's step at 1.0 (7 stored mantissa bits)
    parts = [torch.tensor([1.0, small], dtype=torch.bfloat16), torch.tensor([small, 1.0], dtype=torch.bfloat16),
             torch.tensor([small, small], dtype=torch.bfloat16)]
    total = collective.rank_order_sum(parts)
    assert total.dtype == torch.float32
    # fp32 keeps both small terms: 1 + 2^-7 is a bf16 value, so it survives the one cast;
    # bf16 adds in order round 1 + 2^-8 back to 1 (ties to even) twice and lose them
    assert total.to(torch.bfloat16).tolist() == [1.0 + 2 * small, 1.0 + 2 * small]
    assert ((parts[0] + parts[1]) + parts[2]).tolist() == [1.0, 1.0]


class _NoTruth:
    """A collective that must be called, never tested for truth: torch 2.11's dynamo graph-broke at
    `original or dist.all_reduce` (a truth test of the collective it rewrites) on every all-reduce."""

    def __bool__(self):
        raise AssertionError("the invariant all-reduce tested a collective function for truth")

    def __call__(self, tensor, op=None, group=None, async_op=False):
        return None


def test_the_invariant_all_reduce_sums_without_testing_the_original_for_truth(monkeypatch):
    monkeypatch.setitem(collective._STATE, "original", _NoTruth())
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(collective, "gather", lambda tensor, group=None: [tensor.clone(), torch.ones_like(tensor)])
    t = torch.tensor([1.0, 2.0])
    assert collective.invariant_all_reduce(t) is None
    assert t.tolist() == [2.0, 3.0]  # p0 + p1 in rank order
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)  # one rank: the original, called
    assert collective.invariant_all_reduce(t) is None and t.tolist() == [2.0, 3.0]
