"""`nondet probe --endpoint A --against B`: two deployments of one model compared.

The logprob path runs against two stub servers (tests/stub_server.py) started with different
answers: a positive control whose logprob bits (or tokens) differ at a known step, and a
negative control of two identical stubs that must show no divergence. The real path runs two
`transformers serve` processes on loopback with different settings (with and without
--continuous-batching), plus a server of other weights as the positive control; those
servers return no logprobs, so only tokens are compared there.
"""

import json
import os

import pytest
from stub_server import Answer, StubServer

from nondet.probes.probe import ProbeConfig, run_probe
from nondet.probes.core.load_config import LoadConfig
import cli_runner

BITS_OFF_AT_2 = Answer(logprobs=(-0.5, -0.5, -0.5000000000000001, -0.5))  # one ULP at step 2, same tokens
TOKEN_OFF_AT_1 = Answer(words=(" alpha", " zeta", " gamma", " delta"))


def nondet(*args):
    return cli_runner.run(args, env=dict(os.environ), timeout=120)


def against(a: StubServer, b: StubServer, tmp_path, runs: int = 2) -> dict:
    load = LoadConfig(mode="server", endpoint=a.url, against=b.url, rate=50.0)
    return run_probe(ProbeConfig(max_new_tokens=4, runs=runs, out=str(tmp_path / "run"), load=load)).summary


# -- the logprob path: two stubs ------------------------------------------------------------


def test_negative_control_identical_deployments_show_no_divergence(tmp_path):
    with StubServer() as a, StubServer() as b:
        summary = against(a, b, tmp_path)
    section = summary["against"]
    assert section["compare_level"] == "logprobs" and section["reference"] == "side A's request sent alone (run 0)"
    assert section["across"] == {"distinct_completions": 1, "completions_on_both_sides": 1,
                                 "first_token_divergence": None, "first_token_divergence_any": None,
                                 "first_logprob_divergence": None, "logprobs_na": None}
    assert [(s["side"], s["n_runs"], s["distinct_completions"], s["first_token_divergence"],
             s["first_numeric_divergence"]) for s in section["sides"]] == [("A", 3, 1, None, None),
                                                                          ("B", 3, 1, None, None)]
    m = summary["modes"]["default"]
    assert (m["n_runs"], m["distinct_completions"], m["first_numeric_divergence"]) == (6, 1, None)
    assert summary["verdict"].startswith("the deployments agree alone: same tokens, bit-identical logprobs")


def test_positive_control_one_ulp_of_logprob_is_found_at_its_step(tmp_path):
    with StubServer() as a, StubServer(answer=BITS_OFF_AT_2) as b:
        summary = against(a, b, tmp_path)
    across = summary["against"]["across"]
    assert (across["first_logprob_divergence"], across["first_token_divergence"]) == (2, None)
    assert across["distinct_completions"] == 1
    rows = {c["condition_id"]: c for c in summary["modes"]["default"]["conditions"]}
    assert rows["default/server-a/burst"]["first_numeric_divergence"] is None  # A agrees with itself
    assert rows["default/server-b/ref"]["first_numeric_divergence"] == 2  # the diff sees B's bits from A alone
    assert summary["verdict"].startswith("same tokens alone on both deployments, but logprob bits differ from step 2")


def test_positive_control_a_token_divergence_splits_the_completions(tmp_path):
    with StubServer() as a, StubServer(answer=TOKEN_OFF_AT_1) as b:
        summary = against(a, b, tmp_path)
    across = summary["against"]["across"]
    assert (across["first_token_divergence"], across["first_token_divergence_any"]) == (1, 1)
    assert (across["distinct_completions"], across["completions_on_both_sides"]) == (2, 0)
    assert [s["distinct_completions"] for s in summary["against"]["sides"]] == [1, 1]  # each side agrees with itself
    tree = summary["modes"]["default"]["branch_tree"]
    assert tree["step"] == 1 and sorted(a["count"] for a in tree["alternatives"]) == [3, 3]


def test_one_side_without_logprobs_compares_texts_and_says_bits_are_na(tmp_path):
    with StubServer() as a, StubServer(mode="nologprobs", answer=BITS_OFF_AT_2) as b:
        summary = against(a, b, tmp_path)
    section = summary["against"]
    assert section["compare_level"] == "text"
    assert section["across"]["first_logprob_divergence"] is None
    assert section["across"]["logprobs_na"] == "logprobs are compared only where both servers return them"
    assert summary["modes"]["default"]["numeric_na"] == "server returned no logprobs"


def test_run_directory_labels_each_side_and_the_cli_reports_it(tmp_path):
    with StubServer() as a, StubServer(answer=TOKEN_OFF_AT_1) as b:
        r = nondet("probe", "--endpoint", a.url, "--against", b.url, "--runs", "1", "-n", "4", "--rate", "50",
                   "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert "two deployments, compared at level logprobs" in r.stdout
    run = tmp_path / "run"
    conditions = [json.loads(line) for line in (run / "conditions.jsonl").read_text().splitlines()]
    assert [(c["condition_id"], c["side"], c["endpoint"]) for c in conditions] == [
        ("default/server-a/ref", "A", a.url), ("default/server-a/burst", "A", a.url),
        ("default/server-b/ref", "B", b.url), ("default/server-b/burst", "B", b.url)]
    assert conditions[0]["label"] == f"A {a.url}: alone (reference)"
    streams = [json.loads(line) for line in (run / "streams.jsonl").read_text().splitlines()]
    assert sorted(s["run_id"] for s in streams) == [0, 1, 2, 3]
    assert [s["run_id"] for s in streams if s["is_reference"]] == [0]
    fp = json.loads((run / "fingerprint.json").read_text())
    assert fp["load"]["against"] == b.url and set(fp["load"]["sides"]) == {"A", "B"}
    assert (run / "report.md").exists()  # the report stage reads it unchanged


# -- bad input and failing servers: one line, distinct exit codes ----------------------------


@pytest.mark.parametrize("args", [["--against", "http://127.0.0.1:9"],
                                  ["--against", "http://127.0.0.1:9", "--resume", "somewhere"]])
def test_against_needs_an_endpoint_and_no_resume(tmp_path, args):
    r = nondet("probe", *args, "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--against URL_B compares with --endpoint URL_A" in r.stderr or "is not a server probe" in r.stderr


def test_unreachable_side_b_exits_3_in_one_line(tmp_path):
    with StubServer() as a:
        r = nondet("probe", "--endpoint", a.url, "--against", "http://127.0.0.1:9", "--runs", "1", "-n", "2",
                   "--timeout", "5", "--out", str(tmp_path / "run"))
    assert r.returncode == 3
    assert r.stderr.startswith("nondet: error: cannot reach http://127.0.0.1:9/v1/models: connection refused")
    assert r.stderr.count("\n") == 1 and not (tmp_path / "run" / "streams.jsonl").exists()


def test_malformed_answer_of_side_b_exits_5_in_one_line(tmp_path):
    with StubServer() as a, StubServer(mode="garbage") as b:
        r = nondet("probe", "--endpoint", a.url, "--against", b.url, "--runs", "1", "-n", "2",
                   "--out", str(tmp_path / "run"))
    assert r.returncode == 5
    assert r.stderr == (f"nondet: error: {b.url}/v1/completions answered malformed JSON (Expecting value: line 1 "
                        "column 1 (char 0)): <html>not json{\n")


# -- two real `transformers serve` processes ---------------------------------------------------


@pytest.mark.slow
def test_two_real_transformers_serve_deployments(tmp_path, tiny_model_dir):
    """A: transformers serve without continuous batching; B: the same model with it; C: another
    model's weights (the positive control: a deployment that truly differs); D: A's twin, a second
    server with A's model and settings (the negative control; A against itself is refused). transformers
    serve returns no logprobs, so texts are compared, tokenized with the model's tokenizer."""
    from model_fixtures import save_qwen3
    from serve_fixtures import transformers_serve

    from nondet.probes.models.default_model import build_tokenizer

    other = save_qwen3(tmp_path / "other", build_tokenizer(512), hidden=64, layers=2, heads=4, kv_heads=2, seed=7)
    with transformers_serve(tiny_model_dir, tmp_path / "a", continuous=False) as a, \
            transformers_serve(tiny_model_dir, tmp_path / "b", continuous=True) as b, \
            transformers_serve(other, tmp_path / "c", continuous=False) as c, \
            transformers_serve(tiny_model_dir, tmp_path / "d", continuous=False) as d:
        def probe(url_a, url_b, name):
            load = LoadConfig(mode="server", endpoint=url_a, against=url_b, tokenizer=str(tiny_model_dir), rate=8.0)
            return run_probe(ProbeConfig(max_new_tokens=16, runs=2, out=str(tmp_path / name), load=load)).summary

        settings, weights, itself = probe(a, b, "cb"), probe(a, c, "weights"), probe(a, d, "twin")
    for summary in (settings, weights, itself):
        section = summary["against"]
        assert section["compare_level"] == "tokenizer" and section["across"]["logprobs_na"]
        assert [s["n_runs"] for s in section["sides"]] == [3, 3]
    fp = json.loads((tmp_path / "cb" / "fingerprint.json").read_text())
    assert [fp["load"]["sides"][s]["server"]["completion_headers"]["server"] for s in "AB"] == ["uvicorn"] * 2
    # positive control: other weights leave A's answer at once; negative: A against its twin does not
    assert weights["against"]["across"]["first_token_divergence"] is not None
    assert weights["against"]["across"]["distinct_completions"] >= 2
    assert itself["against"]["across"]["first_token_divergence"] is None
    # with and without continuous batching: what this host's kernels give; the summary must agree with the streams
    streams = [json.loads(line) for line in (tmp_path / "cb" / "streams.jsonl").read_text().splitlines()]
    alone = {s["side"]: [st["token"] for st in s["steps"]] for s in streams if s["request_index"] == 0}
    assert (settings["against"]["across"]["first_token_divergence"] is None) == (alone["A"] == alone["B"])
