"""Bisect on a mixture of experts: router and experts points, routing changes named first, and the
MoE op classes in the ablation (only where the model has them)."""

import torch

import family_models as fm
from nondet.probes.bisect.capture import Point, capture_points
from nondet.probes.bisect.classify import ABLATABLE, ablatable
from nondet.probes.bisect.routing import RoutingWatch
from nondet.verdict import routing_line

ROUTER = Point("model.layers.1.mlp.gate", "router", 1, False, top_k=2)


def test_a_near_tie_that_flips_is_a_routing_change_with_its_margin():
    ref = torch.tensor([[0.1, 2.0, 1.0004, 1.0, -3.0]])  # experts {1, 2}; 2nd vs 3rd margin 0.0004
    got = torch.tensor([[0.1, 2.0, 0.9999, 1.0, -3.0]])  # 1 ULP-scale change: experts {1, 3}
    watch = RoutingWatch()
    watch.check(5, ROUTER, ref, got)
    assert watch.changes == 1
    change = watch.first
    assert (change["step"], change["layer"], change["reference_experts"], change["divergent_experts"]) == (
        5, 1, [1, 2], [1, 3])
    assert abs(change["margin"] - 0.0004) < 1e-6
    assert routing_line(change, 9).startswith("routing changed: step 5, layer 1: experts {1, 2} -> {1, 3}; "
                                              "router margin between the 2nd and 3rd expert 0.0004")


def test_different_bits_with_the_same_experts_is_arithmetic():
    ref = torch.tensor([[0.1, 2.0, 1.5, 1.0], [3.0, 0.0, 0.0, 2.0]])
    got = ref + 1e-6
    watch = RoutingWatch()
    watch.check(0, ROUTER, ref, got)
    assert watch.first is None and watch.changes == 0
    assert routing_line(None, 12) == "routing: same experts at every step (12 steps); the divergence is arithmetic"


def test_router_and_experts_are_their_own_points_and_ablation_classes(tmp_path):
    moe = fm.load(fm.save_family("qwen3-moe", tmp_path / "moe"), torch.float32)
    classes = {p.module: (p.op_class, p.top_k) for p, _, _ in capture_points(moe)}
    assert classes["model.layers.0.mlp.gate"] == ("router", 2)
    assert classes["model.layers.0.mlp.experts"] == ("experts", None)
    assert ablatable(moe) == ABLATABLE + ("experts", "router")
    dense = fm.load(fm.save_family("qwen3", tmp_path / "dense"), torch.float32)
    assert ablatable(dense) == ABLATABLE  # no useless replays on a dense model


def test_bisect_on_an_moe_names_routing_first_and_ablates_the_moe_classes(tmp_path):
    """Probe + bisect of a tiny Qwen3-MoE in fp32 with the batch-variant norm as positive control."""
    from model_fixtures import save_qwen3_moe

    from nondet.probes.bisect import BisectConfig
    from nondet.probes.bisect_probe import run_bisect
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe

    model_dir = save_qwen3_moe(tmp_path / "model")
    run = tmp_path / "run"
    probe = run_probe(ProbeConfig(prompts=("Tell me about Richard Feynman",), batch_sizes=(1, 4), max_new_tokens=6,
                                  model=ModelSpec(str(model_dir), "float32", inject_variance=True), out=str(run)))
    assert probe.summary["modes"]["default"]["first_numeric_divergence"] is not None
    b = run_bisect(BisectConfig(str(run))).bisect
    assert "routing" in b and "routing_changes" in b
    assert b["origin"]["op_class"] != "other"
    ablated = {cls for entry in b["ablation"] for cls in entry["ops"]}
    assert {"experts", "router"} <= ablated
    assert b["minimal_set"], "the full mode removes the injected divergence, so a minimal set exists"


def _stream(run_id, experts, tokens, reference=False, prompt=0):
    steps = [{"token": t, "experts": e} for t, e in zip(tokens, experts)]
    return {"run_id": run_id, "is_reference": reference, "prompt_id": prompt, "steps": steps}


def test_the_probe_summary_counts_runs_whose_routing_changed():
    from nondet.probes.core.summarize import routing_changes

    same = [[[0, 3], [1, 2]]] * 3  # 3 steps x 2 MoE layers x top-2
    moved = [[[0, 3], [1, 2]], [[0, 3], [1, 5]], [[0, 3], [1, 2]]]  # step 1, layer 1
    streams = [_stream(0, same, [7, 8, 9], reference=True), _stream(1, same, [7, 8, 9]),
               _stream(2, moved, [7, 8, 9]), _stream(3, moved, [7, 4, 9])]
    assert routing_changes(streams) == {"runs_changed": 2, "runs": 3, "first": {"step": 1, "layer": 1}}
    assert routing_changes(streams[:2]) == {"runs_changed": 0, "runs": 1, "first": None}  # negative control
    dense = [{"run_id": 0, "is_reference": True, "steps": [{"token": 1}]}]
    assert routing_changes(dense) is None  # nothing to say on a dense model


def test_the_probe_records_each_target_tokens_experts_on_an_moe_only(tmp_path):
    from model_fixtures import save_qwen3_moe

    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe

    model_dir = save_qwen3_moe(tmp_path / "model")
    probe = run_probe(ProbeConfig(prompts=("Tell me about Richard Feynman",), batch_sizes=(1, 2), max_new_tokens=4,
                                  model=ModelSpec(str(model_dir), "float32"), out=str(tmp_path / "run")))
    routing = probe.summary["modes"]["default"]["routing"]
    assert routing["runs"] == 2 and 0 <= routing["runs_changed"] <= 2
    import json

    step = json.loads((tmp_path / "run" / "streams.jsonl").read_text().splitlines()[0])["steps"][0]
    assert len(step["experts"]) == 2 and all(len(ids) == 2 and ids == sorted(ids) for ids in step["experts"])
