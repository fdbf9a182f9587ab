"""Speculative decoding: the one-row decode vs k+1-row verification axis."""

import json
import os
from pathlib import Path

import pytest
import torch

from nondet.errors import UsageError
from nondet.kernels import cpu
from nondet.probes.speculative.speculation import Speculation, parse_speculative
import cli_runner
from controls import FIX_KERNELS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_attention_chunk_equals_one_row_decodes(dtype):
    """A k+1 verification chunk's query i == the one-token decode at its position, bit for bit."""
    torch.manual_seed(5)
    q = torch.randn(1, 4, 5, 16).to(dtype)
    k = torch.randn(1, 2, 30, 16).to(dtype)
    v = torch.randn(1, 2, 30, 16).to(dtype)
    chunk = cpu.attention(q, k, v, None, 0.25, [0])
    for i in range(5):
        solo = cpu.attention(q[:, :, i:i + 1], k[:, :, :26 + i], v[:, :, :26 + i], None, 0.25, [0])
        assert torch.equal(chunk[0, i], solo[0, 0])


# -- forms --------------------------------------------------------------------------------



def test_forms_parse_with_their_names_and_ids():
    forms = parse_speculative("ngram:4, self:2,draft,draft:3,draft:/m/dir:2,draft:/m/dir")
    assert [f.name for f in forms] == ["ngram:4", "self:2", "draft:4", "draft:3", "draft:/m/dir:2", "draft:/m/dir:4"]
    assert forms[4] == Speculation("draft", 2, "/m/dir")
    assert [f.slug for f in forms[:2]] + [forms[4].slug] == ["ngram4", "self2", "draft-dir2"]


@pytest.mark.parametrize("text, message", [
    ("beam:4", "--speculative: unknown form 'beam:4'; use ngram:K, self:K, draft[:K] or draft:MODEL[:K]"),
    ("ngram:0", "--speculative: K in 'ngram:0' must be >= 1 (tokens drafted per verification round)"),
    ("self:-2", "--speculative: K in 'self:-2' must be >= 1 (tokens drafted per verification round)"),
    ("draft:/m:0", "--speculative: K in 'draft:/m:0' must be >= 1 (tokens drafted per verification round)"),
    ("ngram", "--speculative: 'ngram' needs K, the tokens drafted per round, e.g. ngram:4"),
    ("self:x", "--speculative: K in 'self:x' is not an integer"),
    ("ngram:4,ngram:4", "--speculative: 'ngram:4' is given twice"),
])
def test_bad_forms_are_one_line_usage_errors(text, message):
    with pytest.raises(UsageError) as exc:
        parse_speculative(text)
    assert str(exc.value) == message


# -- the CLI: bad input is one line, exit 2 or 3 -----------------------------------------



def nondet(*args):
    return cli_runner.run(args, env=dict(os.environ), timeout=300)


@pytest.mark.parametrize("args, message", [
    (["--speculative", "ngram:0"],
     "--speculative: K in 'ngram:0' must be >= 1 (tokens drafted per verification round)"),
    (["--speculative", "medusa:4"],
     "--speculative: unknown form 'medusa:4'; use ngram:K, self:K, draft[:K] or draft:MODEL[:K]"),
    (["--speculative", "self:4", "--batch-sizes", "1,4"],
     "--speculative runs at batch size 1 (transformers' assisted decoding takes one sequence); drop --batch-sizes"),
    (["--speculative", "self:4", "--temperature", "0.7", "--prompt", "x"],
     "--speculative compares greedy decoding; drop --temperature"),
    (["--speculative", "self:4", "--kv-cache", "static", "--prompt", "x"],  # was decoded on the dynamic one
     "--speculative decodes eager on transformers' dynamic KV cache (a static one comes with --compile); drop "
     "--kv-cache static or add --compile"),
])
def test_cli_usage_errors_before_any_model_loads(tmp_path, args, message):
    r = nondet("probe", *args, "--out", str(tmp_path / "r"))
    assert (r.returncode, r.stderr) == (2, f"nondet: error: {message}\n")


def test_cli_draft_that_cannot_load_exits_3(tmp_path, tiny_model_dir):
    missing = tmp_path / "no-draft"
    r = nondet("probe", "--model", str(tiny_model_dir), "--prompt", "hello", "-n", "2",
               "--speculative", f"draft:{missing}:2", "--out", str(tmp_path / "r"))
    assert r.returncode == 3
    assert r.stderr == f"nondet: error: --speculative draft:{missing}:2: draft model: model directory not found: {missing}\n"


def test_cli_draft_with_another_vocabulary_exits_2(tmp_path, tiny_model_dir):
    other = _tiny_model(tmp_path / "other", vocab=300)
    r = nondet("probe", "--model", str(tiny_model_dir), "--prompt", "hello", "-n", "2",
               "--speculative", f"draft:{other}:2", "--out", str(tmp_path / "r"))
    assert r.returncode == 2
    assert r.stderr.startswith(f"nondet: error: --speculative draft:{other}:2: the draft's vocabulary differs "
                               "from the target's (")
    assert r.stderr.endswith("); a draft must use the target's tokenizer\n") and r.stderr.count("\n") == 1


def test_cli_embedded_draft_needs_the_embedded_model(tmp_path, tiny_model_dir):
    r = nondet("probe", "--model", str(tiny_model_dir), "--prompt", "hello", "-n", "2",
               "--speculative", "draft:2", "--out", str(tmp_path / "r"))
    assert r.returncode == 2
    assert r.stderr == ("nondet: error: --speculative draft:2: the embedded draft fits only the embedded default "
                        "model; name a draft of this model's tokenizer: draft:MODEL[:K]\n")


def _tiny_model(out, vocab: int):
    from model_fixtures import save_qwen3

    from nondet.probes.models.default_model import build_tokenizer

    return save_qwen3(out, build_tokenizer(vocab), hidden=32, layers=1, heads=2, kv_heads=1, seed=2)


# -- the controls, end to end on the embedded default -------------------------------------



@pytest.fixture(scope="module")
def confirmed_run(tmp_path_factory, default_model_dir):
    """`nondet probe --speculative ngram:4,self:4,draft:2 --inject-variance --confirm`, 24 tokens.

    --inject-variance makes one RMSNorm take another path whenever several rows share the call
    (kernels/variant.py), as a k+1 verification chunk does: a positive control that does not
    depend on this host's BLAS."""
    out = tmp_path_factory.mktemp("spec") / "run"
    r = nondet("probe", "--speculative", "ngram:4,self:4,draft:2", "--inject-variance", "--confirm", "-n", "24",
               "--prompt", "Tell me about Richard Feynman", "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    streams = [json.loads(line) for line in (out / "streams.jsonl").read_text().splitlines()]
    return json.loads(r.stdout), streams


def _form(summary, kernels, name):
    return next(f for f in summary["speculative"]["by_form"] if (f["kernels"], f["speculative"]) == (kernels, name))


def test_positive_control_default_kernels_bits_differ_from_plain_greedy(confirmed_run):
    summary, _ = confirmed_run
    for name in ("ngram:4", "self:4", "draft:2"):  # every form the negative control below checks
        form = _form(summary, "default", name)
        assert form["first_numeric_divergence"] is not None, name  # a verification chunk took the split norm
    assert summary["modes"]["default"]["first_numeric_divergence"] is not None


def test_negative_control_batch_invariant_one_completion_identical_bits(confirmed_run):
    summary, streams = confirmed_run  # --confirm ran both: NONDET_TEST_WITHOUT_MODE=1 reads the default's here
    mode = summary["modes"][FIX_KERNELS]
    assert (mode["distinct_completions"], mode["first_numeric_divergence"]) == (1, None)
    for name in ("ngram:4", "self:4", "draft:2"):
        f = _form(summary, FIX_KERNELS, name)
        assert (f["distinct_completions"], f["first_token_divergence"], f["first_numeric_divergence"]) == (1, None, None)
    of_mode = [s for s in streams if s["kernels"] == FIX_KERNELS]
    ref = next(s for s in of_mode if s["is_reference"])
    for s in of_mode:
        assert [(x["token"], x["logprob"], x["top"], x["margin"]) for x in s["steps"]] == \
               [(x["token"], x["logprob"], x["top"], x["margin"]) for x in ref["steps"]]


def test_streams_record_rounds_acceptance_and_speed(confirmed_run):
    summary, streams = confirmed_run
    self4 = next(s for s in streams if s["condition_id"] == "default/spec/self4")
    assert self4["acceptance_rate"] == 1.0 and self4["drafted"][0] == 4  # the model agrees with itself
    assert sum(p + 1 for p in self4["accepted"]) >= len(self4["steps"])  # rounds cover every token
    assert [s["round"] for s in self4["steps"][:6]] == [0, 0, 0, 0, 0, 1]
    assert all(s["tokens_per_s"] > 0 for s in streams)
    row = _form(summary, "default", "ngram:4")
    assert row["speedup"] == pytest.approx(row["tokens_per_s"] / row["reference_tokens_per_s"], rel=0.01)
    conditions = [json.loads(line) for line in
                  (Path(summary["run_dir"]) / "conditions.jsonl").read_text().splitlines()]
    assert {c["load"] for c in conditions} == {"speculative"} and {c["batch_size"] for c in conditions} == {1}


def test_report_has_the_speculative_section(confirmed_run):
    summary, _ = confirmed_run
    run_dir = Path(summary["run_dir"])
    md = (run_dir / "report.md").read_text()
    assert "## Speculative decoding" in md
    assert "| batch-invariant | self:4 | 1 | 1 | 0 of 1 | — | — | 100.0% |" in md
    assert "Speculative decoding" in (run_dir / "report.html").read_text()
