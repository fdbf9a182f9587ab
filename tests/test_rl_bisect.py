"""nondet bisect on a nondet rl run: the sampler's decode vs the trainer's teacher-forced prefill (CPU).

Positive control: the injected batch-variant norm (nondet/kernels/variant.py) takes another path
for the sampler's one-row decode than for the trainer's many-row prefill, on every host; with
the other ablatable classes invariant in every replay (baseline), bisect must name it and the
norm ablation must make every logprob equal. Negative control: the mode on both sides, nothing.
"""

import json

import pytest

from nondet.errors import UsageError
from nondet.probes.bisect import BisectConfig
from nondet.probes.rl.bisect import choose_pair, run_rl_bisect as run_bisect
from nondet.probes.models.loading import ModelSpec
from nondet.rl.config import RLConfig
from nondet.rl.run import run_rl
import cli_runner

PROMPTS = ("Tell me about Richard Feynman", "Hello there", "The history of the printing press", "A cat")
INJECTED = "model.layers.1.post_attention_layernorm"  # variant.inject_batch_variance's default layer


@pytest.fixture(scope="module")
def rl_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("rl-bisect") / "run"
    run_rl(RLConfig(model=ModelSpec(name=str(tiny_model_dir), inject_variance=True), prompts=PROMPTS,
                    max_new_tokens=4, sampler_batch=1, micro_batches=(4,), kernels=("default", "batch-invariant"),
                    out=str(out)))
    return out


def test_bisect_names_the_injected_norm_and_its_ablation_makes_logprobs_equal(rl_run):
    b = run_bisect(BisectConfig(str(rl_run), baseline=("matmul", "attention", "softmax"))).bisect
    assert b["condition_id"] == "default/trainer/mb4/right"  # (the baseline changes the replay's numerics)
    assert b["origin"]["module"] == INJECTED and b["origin"]["op_class"] == "norm"
    assert b["origin"]["step"] >= 1  # a decode step: the sampler's prefill has many rows too
    assert b["rl"]["first_logprob_step"] is not None and b["flip_step"] is None
    (norm,) = [e for e in b["ablation"] if e["ops"] == ["norm"]]
    assert norm["activations_match"] and norm["logprobs_match"] and b["minimal_set"] == ["norm"]
    assert json.loads((rl_run / "ablation.json").read_text())["minimal_set"] == ["norm"]


def test_bisect_finds_nothing_under_the_mode(rl_run):
    b = run_bisect(BisectConfig(str(rl_run), condition="batch-invariant/trainer/mb4/right")).bisect
    assert b["origin"] is None and b["rl"]["first_logprob_step"] is None and b["ablation"] == []
    assert b["reference_reproduced"] is True and b["rl"]["tokens"] == 4


def test_cli_prints_the_rl_comparison(rl_run):
    proc = cli_runner.run(["bisect", str(rl_run), "--condition", "trainer/mb4/right", "--position", "1", "--no-ablation"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "rl: sequence 1: sampler decode (batch 1, row 0) vs trainer prefill (micro-batch 4, right)" in proc.stdout


def test_cli_unknown_trainer_condition_is_one_line(rl_run):
    proc = cli_runner.run(["bisect", str(rl_run), "--condition", "trainer/mb9/left"], timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"nondet: error: {rl_run} has no trainer condition 'trainer/mb9/left'; "
                                   "see summary.json rl.pairs")


def test_rollouts_runs_cannot_be_bisected():
    summary = {"rl": {"pairs": [{"sampler": "external", "n_tokens": 3}]}}
    with pytest.raises(UsageError, match="exported rollouts: their sampler ran outside nondet"):
        choose_pair(summary, None, "RUN")


def test_report_of_the_rl_run_shows_the_bisect(rl_run):
    from nondet.reports import write_report

    run_bisect(BisectConfig(str(rl_run), baseline=("matmul", "attention", "softmax")))
    md, _ = write_report(rl_run)
    text = md.read_text()
    assert "## Where the trainer leaves the sampler" in text and INJECTED in text
    assert "Minimal set that removes the divergence: **norm**" in text


def test_continuous_sampler_runs_cannot_be_bisected():
    from nondet.probes.rl.bisect import plans

    pair = {"sampler": "default", "prompt_ids": [0], "first_diff": [1], "micro_batch": 1}
    streams = [{"side": "sampler", "kernels": "default", "prompt_id": 0, "load": "continuous"}]
    with pytest.raises(UsageError, match="the sampler ran in the continuous-batching engine"):
        plans(pair, streams, None)


def test_max_steps_on_an_rl_run_is_one_line_not_ignored(rl_run):
    proc = cli_runner.run(["bisect", str(rl_run), "--max-steps", "3"], timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("nondet: error: --max-steps does not apply to an rl run")
