"""The prefill axis: --prefix-cache (a warm prefix's KV cache vs one prefill) and --chunked-prefill.

Each prompt runs alone with its prefill cut into forwards on the cache (probes/core/prefill.py)
and is compared with its one-pass prefill. The control of every invariance check is the same
probe with the default kernels on this host: its bits must differ on the case (attention over
keys split between the cache and the call, matmuls over fewer rows), else the check is skipped
with the reason (controls.py). Bisect on a prefill run names the first differing module.
"""

import json

import pytest
from controls import FIX_KERNELS, require_divergence

import cli_runner
from nondet.errors import UsageError
from nondet.probes.core.conditions import plan_prefill
from nondet.probes.core.prefill import PrefillForm, as_forms, parse_prefill, splits
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe

PROMPT = "Tell me about Richard Feynman and the Manhattan Project, then about quantum electrodynamics"
FORMS = ("prefix:auto", "prefix:5", "chunk:3", "chunk:7", "chunk:16")


def test_splits_of_a_prefix_and_of_chunks():
    assert splits("prefix", 5, 12) == (5,)
    assert splits("chunk", 4, 12) == (4, 8)  # the generate call prefills the last piece, 8..11
    assert splits("chunk", 5, 12) == (5, 10)
    assert splits("prefix", 12, 12) == () and splits("chunk", 12, 12) == ()  # nothing left for generate


def test_auto_sizes_follow_the_prompt_and_never_reach_its_end():
    assert PrefillForm("prefix", 0).sizes(20) == (5, 10, 15)
    assert PrefillForm("chunk", 0).sizes(16) == (2, 4, 8)
    assert PrefillForm("prefix", 0).sizes(2) == (1,)
    assert PrefillForm("prefix", 7).sizes(3) == (7,)  # an explicit size is kept; plan_prefill skips it


def test_plan_prefill_skips_what_does_not_fit_and_duplicates():
    plan = plan_prefill(as_forms(("prefix:auto", "prefix:10", "chunk:50")), [20, 8], "default")
    ids = [c.condition_id for c in plan]
    assert ids == ["default/p0/prefix/5", "default/p0/prefix/10", "default/p0/prefix/15", "default/p1/prefix/2",
                   "default/p1/prefix/4", "default/p1/prefix/6"]
    assert all(c.batch_size == 1 and not c.is_reference for c in plan)
    assert plan[1].splits == (10,) and plan[1].label == "p0 prefix 10 cached"


def test_parse_prefill_flags():
    assert parse_prefill("8,16", "auto") == ("prefix:8", "prefix:16", "chunk:auto")
    assert parse_prefill(None, None) == ()
    for bad in ("0", "x", "", "4,-1"):
        with pytest.raises(UsageError, match="--prefix-cache"):
            parse_prefill(bad, None)


def _probe(out, model_dir, kernels, dtype="bfloat16"):
    kernels = tuple(dict.fromkeys(kernels))
    config = ProbeConfig(prompt=PROMPT, model=ModelSpec(str(model_dir), dtype=dtype, inject_variance=False),
                         batch_sizes=(1,), max_new_tokens=10, kernels=kernels, prefill=FORMS, out=str(out),
                         threads=1)
    return run_probe(config)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """A random Qwen3 (hidden 256) in fp32, probed on the prefill axis with the default kernels and the mode.
    fp32, not bf16: with ATEN_CPU_CAPABILITY=default a bf16 split prefill gave the one-pass bits on an
    AVX-512 Xeon (the control did not fire); the fp32 one differs on both instruction sets."""
    from model_fixtures import save_qwen3

    from nondet.probes.models.default_model import build_tokenizer

    root = tmp_path_factory.mktemp("prefill")
    model = save_qwen3(root / "model", build_tokenizer(512), hidden=256, layers=2, heads=4, kv_heads=2, seed=0)
    return _probe(root / "run", model, ("default", FIX_KERNELS), dtype="float32"), model


def test_default_kernels_leave_one_pass_prefill_and_the_mode_does_not(qwen3):
    result, _ = qwen3
    section = result.summary["prefill"]
    require_divergence(result.summary["modes"]["default"], "the prefill axis of an fp32 Qwen3")
    default = [f for f in section["by_form"] if f["kernels"] == "default"]
    assert any(f["prompts_bits_differ"] for f in default)  # the control, stated
    fixed = [f for f in section["by_form"] if f["kernels"] == FIX_KERNELS]
    assert {(f["kind"], f["size"]) for f in fixed} == {(f["kind"], f["size"]) for f in default}
    assert len(fixed) >= 6  # auto's three prefixes, prefix 5, chunks of 3 / 7 / 16
    assert all(f["prompts_bits_differ"] == 0 and f["distinct_completions"] == 1 for f in fixed)
    assert result.summary["modes"][FIX_KERNELS]["first_numeric_divergence"] is None


def test_prefill_runs_are_recorded_for_bisect_and_the_report(qwen3):
    result, _ = qwen3
    conditions = [json.loads(line) for line in (result.run_dir / "conditions.jsonl").read_text().splitlines()]
    chunk = next(c for c in conditions if c["condition_id"] == "default/chunk/3")
    assert chunk["prefill"] == "chunk:3" and chunk["splits"][:3] == [3, 6, 9] and chunk["batch_size"] == 1
    streams = [json.loads(line) for line in (result.run_dir / "streams.jsonl").read_text().splitlines()]
    assert sum(bool(s.get("prefill")) for s in streams) == len(result.summary["prefill"]["conditions"])


def test_bisect_names_the_first_module_whose_bits_differ(qwen3):
    result, _ = qwen3
    differing = [c for c in result.summary["prefill"]["conditions"]
                 if c["kernels"] == "default" and c["first_numeric_divergence"] is not None]
    if not differing:
        pytest.skip("control did not fire: the default kernels are invariant on the prefill axis here")
    done = cli_runner.run(["bisect", str(result.run_dir), "--condition", differing[0]["condition_id"], "--json"])
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["condition_id"] == differing[0]["condition_id"]
    assert found["origin"]["module"].startswith("model.layers.")  # e.g. model.layers.0.self_attn.core
    assert found["origin"]["step"] <= differing[0]["first_numeric_divergence"]
    assert found["probe_numeric_step"] == differing[0]["first_numeric_divergence"]  # the replay is the probe's
    assert found["minimal_set"]  # the ablation removes it with a set of the mode's op classes


def test_report_has_the_prefill_section_and_figure(qwen3):
    result, _ = qwen3
    done = cli_runner.run(["report", str(result.run_dir)])
    assert done.returncode == 0, done.stderr
    markdown = (result.run_dir / "report.md").read_text()
    assert "## Prefix cache and chunked prefill" in markdown and "chunks of 3" in markdown
    assert (result.run_dir / "figures" / "prefill.svg").stat().st_size > 1000


@pytest.mark.parametrize("extra", [["--load", "continuous"], ["--kv-cache", "static"], ["--budget", "30"]])
def test_prefill_refuses_what_builds_its_own_cache(tmp_path, extra):
    done = cli_runner.run(["probe", "--prefix-cache", "4", "-b", "1", "-n", "2", "--out", str(tmp_path / "r"), *extra])
    assert done.returncode == 2 and "--prefix-cache / --chunked-prefill run in process" in done.stderr


def test_bad_prefill_sizes_are_one_line(tmp_path):
    done = cli_runner.run(["probe", "--chunked-prefill", "0", "-b", "1", "--out", str(tmp_path / "r")])
    assert done.returncode == 2 and "--chunked-prefill: give token counts >= 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_mixture_of_experts_keeps_one_pass_bits_under_the_mode(tmp_path):
    """A random fp32 Qwen3-MoE (8 experts, top-2): its experts see fewer tokens per call in a split prefill."""
    from model_fixtures import save_qwen3_moe

    model = save_qwen3_moe(tmp_path / "moe", hidden=128)
    result = _probe(tmp_path / "run", model, ("default", FIX_KERNELS), dtype="float32")
    require_divergence(result.summary["modes"]["default"], "the prefill axis of a random Qwen3-MoE")
    fixed = [f for f in result.summary["prefill"]["by_form"] if f["kernels"] == FIX_KERNELS]
    assert fixed and all(f["prompts_bits_differ"] == 0 for f in fixed)


def test_a_size_no_prompt_can_run_is_said(tmp_path, tiny_model_dir):
    done = cli_runner.run(["probe", "--model", str(tiny_model_dir), "-p", "one two three", "-b", "1", "-n", "2",
                           "--chunked-prefill", "2,500", "--out", str(tmp_path / "r")])
    assert done.returncode == 0, done.stderr
    assert "prefill chunk:500: not run, every prompt is 500 tokens or shorter" in done.stdout
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["prefill"]["not_run"] == ["chunk:500"]
    assert [f["size"] for f in summary["prefill"]["by_form"]] == [2]
