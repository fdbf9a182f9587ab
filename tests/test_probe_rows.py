"""Every row a target: with several prompts the other rows of a batch are the other
prompts, so a batch size B takes about ceil(P/B) generate calls and every row is a compared
stream, each against its own prompt alone at batch size 1."""

import json

import pytest
from controls import FIX_KERNELS

from nondet.errors import UsageError
from nondet.probes.core.batch import build_batch
from nondet.probes.core.conditions import condition_from_record, plan_rows, resolve_placement
from nondet.probes.core.corpus import DEMO_PROMPTS
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe

LENGTHS = [5, 6, 5, 5, 4, 1, 4, 5]  # the demo prompts' token counts on the embedded tokenizer


def test_rows_groups_equal_lengths_so_no_row_is_padded():
    plan = plan_rows((1, 2, 8), LENGTHS, "rows", False, "default")
    refs = [c for c in plan if c.is_reference]
    assert [(c.prompt_id, c.condition_id) for c in refs][:2] == [(0, "default/p0/bs1/ref"), (1, "default/p1/bs1/ref")]
    bs2 = [c.row_prompts for c in plan if c.batch_size == 2]
    assert bs2 == [(0, 2), (3, 7), (1, -1), (4, 6), (5, -1)]  # 5 calls, not 8
    bs8 = [c.row_prompts for c in plan if c.batch_size == 8]
    assert [tuple(k for k in r if k >= 0) for r in bs8] == [(0, 2, 3, 7), (1,), (4, 6), (5,)]
    for c in plan:  # every prompt is a target once per batch size
        assert c.positions == tuple(i for i, k in enumerate(c.row_prompts or (c.prompt_id,)) if k >= 0)
    prompts = [[10 + k] * n for k, n in enumerate(LENGTHS)]
    for c in plan[8:]:
        batch = build_batch(c, prompts[c.prompt_id], [[1, 2, 3]], 0, prompts)
        assert all(all(row) for row in batch.attention_mask), c.label  # no padding anywhere


def test_padded_mixes_all_prompts_in_ceil_p_over_b_calls():
    plan = plan_rows((1, 2, 4, 8), LENGTHS, "padded", False, "default")
    assert [sum(c.batch_size == b for c in plan) for b in (1, 2, 4, 8)] == [8, 4, 2, 1]
    c = next(c for c in plan if c.batch_size == 8)
    assert c.label == "bs=8 padded p0,p1,p2,p3,p4,p5,p6,p7" and c.fillers == "padded"
    prompts = [[10 + k] * n for k, n in enumerate(LENGTHS)]
    batch = build_batch(c, prompts[0], [[1]], 0, prompts)
    assert [sum(m) for m in batch.attention_mask] == LENGTHS and len(batch.input_ids[5]) == 6


def test_placement_auto_and_runs():
    assert resolve_placement("auto", 8, None) == "rows"
    assert resolve_placement("auto", 1, None) == "ends"
    assert resolve_placement("auto", 8, 6) == "ends"  # --runs spreads one prompt's copies
    with pytest.raises(UsageError, match="--runs"):
        resolve_placement("rows", 8, 6)
    with pytest.raises(UsageError, match="--positions must be one of auto, ends"):
        resolve_placement("middle", 8, None)


def test_condition_record_rebuilds_the_batch_or_says_what_it_needs():
    c = plan_rows((1, 2), [3, 3], "rows", False, "default")[2]
    record = {"condition_id": c.condition_id, "kernels": "default", "batch_size": 2, "positions": [0, 1],
              "fillers": "prompts", "prompt_id": 0, "row_prompts": [0, 1]}
    rebuilt = condition_from_record(record)
    assert (rebuilt.condition_id, rebuilt.row_prompts, rebuilt.positions) == (c.condition_id, c.row_prompts, (0, 1))
    prompts = [[1, 2, 3], [4, 5, 6]]
    assert build_batch(condition_from_record(record), prompts[0], [[9]], 0, prompts).input_ids == prompts
    without = condition_from_record({k: v for k, v in record.items() if k != "row_prompts"})
    with pytest.raises(UsageError, match="holds several prompts"):
        build_batch(without, prompts[0], [[9]], 0)


def test_rows_positive_control_and_the_mode_holds(tmp_path):
    # inject_variance: a batched row's norm differs from a lone row's on every host, so every
    # prompt's bits differ in its batched rows; the mode gives one completion per prompt.
    cfg = ProbeConfig(prompts=DEMO_PROMPTS, model=ModelSpec(inject_variance=True), batch_sizes=(1, 2, 8),
                      max_new_tokens=8, out=str(tmp_path / "run"),
                      kernels=tuple(dict.fromkeys(("default", FIX_KERNELS))))
    modes = run_probe(cfg).summary["modes"]
    d, bi = modes["default"], modes[FIX_KERNELS]
    assert d["n_prompts"] == 8 and d["n_runs"] == 24 and d["prompts_bits_differ"] == 8
    assert bi["n_runs"] == 24 and bi["distinct_completions"] == 1 and bi["first_numeric_divergence"] is None
    streams = [json.loads(x) for x in (tmp_path / "run" / "streams.jsonl").read_text().splitlines()]
    conditions = [json.loads(x) for x in (tmp_path / "run" / "conditions.jsonl").read_text().splitlines()]
    assert len(conditions) == 2 * (8 + 5 + 4)  # generate calls: 8 alone, 5 at bs 2, 4 at bs 8
    by_id = {c["condition_id"]: c for c in conditions}
    for s in streams:  # each row's stream names its own prompt, whose reference it is compared with
        c = by_id[s["condition_id"]]
        assert s["prompt_id"] == (c["row_prompts"][s["position"]] if "row_prompts" in c else c["prompt_id"])
    rows8 = [c for c in d["conditions"] if c["condition_id"] == "default/bs8/rows/0"]
    assert len(rows8) == 1 and rows8[0]["n_runs"] == 4  # one row per batch in the summary: p0, p2, p3, p7
    refs = {s["prompt_id"]: s["steps"] for s in streams if s["is_reference"] and s["kernels"] == FIX_KERNELS}
    assert all(s["steps"] == refs[s["prompt_id"]] for s in streams if s["kernels"] == FIX_KERNELS)
