"""The op census end to end: refusal (exit 3), --allow-uncovered's partly invariant label in every
output, the gate failing such a run, and `nondet kernels coverage`."""

import json

import pytest

from nondet.gate import evaluate
import cli_runner


def nondet(*args):
    return cli_runner.run(args, timeout=600)


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):
    """A tiny Qwen3-Next (gated delta-rule linear attention: cumsum, a causal convolution) with a tokenizer."""
    import torch
    import transformers as tf

    from nondet.probes.models.default_model import build_tokenizer

    out = tmp_path_factory.mktemp("qwen3-next")
    tokenizer = build_tokenizer(512)
    tokenizer.save_pretrained(out)
    config = tf.Qwen3NextConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=8, intermediate_size=64, num_experts=4,
                                num_experts_per_tok=2, moe_intermediate_size=16, linear_num_value_heads=4,
                                linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return out


def _probe(model_dir, out, *extra):
    return nondet("probe", "--model", str(model_dir), "--dtype", "float32", "-p", "hello there", "-b", "1,2",
                  "-n", "3", "--kernels", "batch-invariant", "--out", str(out), *extra)


def test_an_uncovered_model_is_refused_in_one_line_exit_3(hybrid_dir, tmp_path):
    result = _probe(hybrid_dir, tmp_path / "run")
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "linear_attn: aten::" in lines[0] and "is not covered" in lines[0]
    assert "--allow-uncovered" in lines[0]


def test_allow_uncovered_labels_the_run_partly_invariant_and_the_gate_fails_it(hybrid_dir, tmp_path):
    run = tmp_path / "run"
    result = _probe(hybrid_dir, run, "--allow-uncovered")
    assert result.returncode == 0, result.stderr
    summary = json.loads((run / "summary.json").read_text())
    fingerprint = json.loads((run / "fingerprint.json").read_text())
    assert summary["kernel_coverage"]["coverage"] == "partly invariant"
    assert any("aten::cumsum" in op for op in summary["kernel_coverage"]["uncovered"])
    assert "partly invariant" in summary["verdict"] and "partly invariant" in result.stdout
    assert fingerprint["census"]["counts"]["uncovered"] > 0 and fingerprint["census"]["coverage"] == "partly invariant"
    assert "partly invariant" in (run / "report.md").read_text()
    verdict = evaluate(summary)
    assert not verdict.passed and "partly invariant" in verdict.message


def test_a_covered_run_is_labelled_invariant_and_the_gate_can_pass_it(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    result = nondet("probe", "--model", str(tiny_model_dir), "-p", "hello there", "-b", "1,2", "-n", "3",
                    "--kernels", "batch-invariant", "--out", str(run))
    assert result.returncode == 0, result.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["kernel_coverage"] == {"coverage": "invariant", "uncovered": []}
    assert "partly" not in summary["verdict"]
    assert evaluate(summary).passed


def test_kernels_coverage_prints_the_census_and_exits_3_where_the_mode_refuses(hybrid_dir, tiny_model_dir):
    covered = nondet("kernels", "coverage", "--model", str(tiny_model_dir), "--json")
    assert covered.returncode == 0, covered.stderr
    found = json.loads(covered.stdout)
    assert found["counts"]["uncovered"] == 0 and found["counts"]["routed"] > 0
    refused = nondet("kernels", "coverage", "--model", str(hybrid_dir), "--dtype", "float32")
    assert refused.returncode == 3
    assert "uncovered" in refused.stdout and "aten::cumsum" in refused.stdout
    assert "is not covered" in refused.stderr



def test_speculative_decoding_of_a_stateful_model_is_one_line(hybrid_dir, tmp_path):
    """Qwen3-Next keeps a recurrent state: transformers refuses assisted generation on it (it was exit 70, an
    internal error, at the first speculative condition); now one line before any condition, exit 2."""
    r = nondet("probe", "--model", str(hybrid_dir), "--dtype", "float32", "-p", "hello there", "-n", "3",
               "--speculative", "ngram:2", "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "Qwen3NextForCausalLM is stateful" in r.stderr and "without --speculative" in r.stderr


def test_allow_uncovered_reaches_a_draft_model_too(hybrid_dir):
    """A draft's kernels under the mode take --allow-uncovered as the target's do (the draft's census once
    refused it whatever the flag); without the flag it is refused, exit 3's error."""
    import dataclasses

    from nondet.errors import UnsupportedModelError
    from nondet.probes.core.source import Planned
    from nondet.probes.models.loading import ModelSpec, load_model
    from nondet.probes.probe import ProbeConfig
    from nondet.probes.speculative.source import SpeculativeSource
    from nondet.probes.speculative.speculation import parse_speculative

    (form,) = parse_speculative(f"draft:{hybrid_dir}:2")
    planned = Planned("batch-invariant/spec/draft", form.name, "batch-invariant", (0, form))
    draft = load_model(ModelSpec(str(hybrid_dir), "float32"))
    for allowed in (False, True):
        source = SpeculativeSource.__new__(SpeculativeSource)
        source.config = dataclasses.replace(ProbeConfig(), allow_uncovered=allowed)
        source.drafts = {form.name: draft}
        if not allowed:
            with pytest.raises(UnsupportedModelError, match="draft model: .*is not covered"):
                source._draft_kernels(planned, form)
            continue
        with source._draft_kernels(planned, form):
            pass
