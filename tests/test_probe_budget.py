"""`nondet probe --budget`: plan the sweep to fit, say what was left out."""

import json

import pytest

from nondet.probes.static.budget import StepCost, fit, from_timings, levels
from nondet.probes.core.conditions import plan_rows
from nondet.probes.probe import ProbeConfig, run_probe


def test_levels_order_and_fit():
    assert levels([1, 2, 4, 8]) == [1, 8, 2, 4]
    assert levels([1]) == [1] and levels([1, 16]) == [1, 16]
    plan = plan_rows((1, 2, 4, 8), [5] * 8, "rows", False, "default")  # 8 refs, 4 + 2 + 1 batches
    cost = {"default": StepCost((1, 0.01), (8, 0.03))}  # 10 ms per step alone, 30 ms at batch 8
    # 100 tokens: refs 8 s, bs8 1 call 3 s, bs2 4 calls at 11.4 ms -> 4.6 s, bs4 2 calls at 18.6 ms -> 3.7 s
    kept = fit(plan, cost, 100, 12.0)
    assert sorted({c.batch_size for c in kept.conditions}) == [1, 8]
    assert kept.left_out == ["batch size 2: 4 generate calls, about 5 s", "batch size 4: 2 generate calls, about 4 s"]
    assert sorted({c.batch_size for c in fit(plan, cost, 100, 15.0).conditions}) == [1, 4, 8]  # 2 skipped, 4 fits
    assert [c.batch_size for c in fit(plan, cost, 100, 1.0).conditions] == [1] * 8  # references always run
    # 1-step and 8-step calls: 7 steps apart; the rest of the 1-step call is the fixed cost
    timed = from_timings({1: 0.05, 8: 0.1}, {1: 0.12, 8: 0.31}, 8)
    assert timed.small[1] == pytest.approx(0.01) and timed.large[1] == pytest.approx(0.03)
    assert timed.call == pytest.approx(0.07)
    with_call = StepCost((1, 0.01), (8, 0.03), call=0.5)
    assert sorted({c.batch_size for c in fit(plan, {"default": with_call}, 100, 12.0).conditions}) == [1]  # 8 x 0.5 s more


def test_budget_run_says_what_was_left_out(tmp_path):
    # A budget far below the sweep: the references run (the least a probe can do), prompts are
    # dropped to the first one, and summary.json lists what was left out.
    prompts = ("Tell me about Richard Feynman", "The history of the printing press")
    cfg = ProbeConfig(prompts=prompts, batch_sizes=(1, 2, 8), max_new_tokens=40, budget=0.01,
                      out=str(tmp_path / "run"))
    s = run_probe(cfg).summary
    b = s["budget"]
    assert b["seconds"] == 0.01 and set(b["ms_per_step"]["default"]) == {"1", "8"}
    assert b["left_out"][0] == "prompts p1: not run"
    assert [line.split(":")[0] for line in b["left_out"][1:]] == ["batch size 8", "batch size 2"]
    assert s["modes"]["default"]["n_runs"] == 1
    cfg = ProbeConfig(prompts=prompts, batch_sizes=(1, 2), max_new_tokens=4, budget=600, out=str(tmp_path / "all"))
    s = run_probe(cfg).summary
    assert s["budget"]["left_out"] == [] and s["modes"]["default"]["n_runs"] == 4
    assert json.loads((tmp_path / "all" / "summary.json").read_text())["budget"]["planned_seconds"] >= 0
