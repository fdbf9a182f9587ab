"""`--against` across two engines: the engine each server names, llama.cpp's answer shape, and
the wording that calls a difference between two engines a cross-engine comparison, not batch
variance. Stub servers (tests/stub_server.py) stand for the engines: `engine="llama.cpp"` answers
as llama.cpp's server does. tests/test_llama_cpp_server.py runs the real one."""

import json
import os

import pytest
from stub_server import Answer, StubServer

from nondet.probes.probe import ProbeConfig, run_probe
from nondet.probes.core.load_config import LoadConfig
from nondet.probes.server import compare
from nondet.probes.server.engines import different_engines, engine_of
from nondet.probes.server.responses import parse_completion
from nondet.reports import write_report
import cli_runner

OTHER_FIRST_TOKEN = Answer(words=(" omega", " beta", " gamma", " delta"))


def nondet(*args):
    return cli_runner.run(args, env=dict(os.environ), timeout=120)


@pytest.mark.parametrize("owned_by, headers, engine", [
    ([], {"server": "llama.cpp"}, "llama.cpp server"),
    (["llamacpp"], {}, "llama.cpp server"),
    (["me"], {"server": "uvicorn"}, "llama-cpp-python"),
    (["vllm"], {"server": "uvicorn", "x-request-id": "1"}, "vLLM"),
    (["sglang"], {}, "SGLang"),
    ([], {"server": "uvicorn", "x-request-id": "5e1c"}, "transformers serve"),
    ([], {"server": "uvicorn"}, None),
    (["someone"], {"server": "nginx"}, None),
])
def test_the_engine_is_named_from_what_the_server_says(owned_by, headers, engine):
    assert engine_of(owned_by, headers) == engine


def test_two_engines_only_when_they_are_told_apart():
    assert different_engines("llama.cpp server", "transformers serve")
    assert different_engines(None, "llama.cpp server")  # a server without llama.cpp's marks is not llama.cpp
    assert not different_engines("vLLM", "vLLM")
    assert not different_engines(None, None)  # two unrecognized servers: nothing says they differ


def test_llama_cpp_completion_logprobs_in_the_chat_shape_are_read():
    body = {"choices": [{"text": " a b", "finish_reason": "length", "logprobs": {"content": [
        {"id": 3, "token": " a", "logprob": -0.25, "top_logprobs": [{"id": 3, "token": " a", "logprob": -0.25},
                                                                    {"id": 9, "token": " c", "logprob": -2.0}]},
        {"id": 4, "token": " b", "logprob": -1.5, "top_logprobs": []}]}}]}
    c = parse_completion(body, chat=False, where="u")
    steps = compare.steps_at(compare.level_of(c.tokens, None), c.text, c.tokens, None)
    assert [s["piece"] for s in steps] == [" a", " b"]
    assert steps[0]["logprob"] == (-0.25).hex() and steps[0]["margin"] == (1.75).hex()


def against(a: StubServer, b: StubServer, tmp_path) -> dict:
    load = LoadConfig(mode="server", endpoint=a.url, against=b.url, rate=50.0)
    return run_probe(ProbeConfig(max_new_tokens=4, runs=2, out=str(tmp_path / "run"), load=load)).summary


def test_positive_two_engines_are_a_cross_engine_comparison_not_batch_variance(tmp_path):
    with StubServer() as a, StubServer(engine="llama.cpp", answer=OTHER_FIRST_TOKEN) as b:
        summary = against(a, b, tmp_path)
    section = summary["against"]
    assert section["cross_engine"] and section["compare_level"] == "logprobs"
    assert [s["engine"] for s in section["sides"]] == [None, "llama.cpp server"]
    assert section["across"]["first_token_divergence"] == 0
    assert summary["verdict"] == (
        "cross-engine comparison, not batch variance: A is an unrecognized engine, B is llama.cpp server; "
        "different engines compute with different kernels and arithmetic (and may read other weight formats), "
        "so their logits are expected to differ from step 0; the engines differ: B's answer alone leaves A's at "
        "token 0; 2 distinct completions over both sides; batch variance within each engine: "
        "A: 1 distinct over 3 runs; B: 1 distinct over 3 runs")
    fp = json.loads((tmp_path / "run" / "fingerprint.json").read_text())
    server_b = fp["load"]["sides"]["B"]["server"]
    assert (server_b["engine"], server_b["owned_by"], server_b["system_fingerprint"]) == (
        "llama.cpp server", ["llamacpp"], "b0-stub")


def test_positive_the_cli_and_the_report_say_cross_engine(tmp_path):
    with StubServer() as a, StubServer(engine="llama.cpp", answer=OTHER_FIRST_TOKEN) as b:
        r = nondet("probe", "--endpoint", a.url, "--against", b.url, "--runs", "1", "-n", "4", "--rate", "50",
                   "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())  # rich wraps long lines
    assert "two engines (a cross-engine comparison: expected to differ from step 0, not batch variance)" in out
    assert "cross-engine comparison, not batch variance: A is an unrecognized engine, B is llama.cpp server" in out
    report = (tmp_path / "run" / "report.md").read_text()
    assert "**Cross-engine comparison, not batch variance: A is an unrecognized engine, B is llama.cpp server" in report
    assert "Cross-engine comparison: the two sides are different engines" in report
    assert "Batch-variant" not in report


def test_negative_two_servers_of_one_engine_are_two_deployments(tmp_path):
    with StubServer(engine="llama.cpp") as a, StubServer(engine="llama.cpp", answer=OTHER_FIRST_TOKEN) as b:
        summary = against(a, b, tmp_path)
    section = summary["against"]
    assert not section["cross_engine"] and [s["engine"] for s in section["sides"]] == ["llama.cpp server"] * 2
    assert summary["verdict"].startswith("the deployments differ: B's answer alone leaves A's at token 0")
    assert "engine" not in summary["verdict"]
    report = write_report(tmp_path / "run")[0].read_text()
    assert "**The deployments differ: B's answer alone leaves A's at token 0" in report
    assert "ross-engine" not in report and "Batch-variant" not in report


def test_the_report_of_an_engine_without_logprobs_against_one_with_them(tmp_path):
    """transformers serve's shape (no logprobs) against llama.cpp's: the run directory keeps each
    side's steps as answered, so the report's tables hold logprobs on one side only."""
    with StubServer(mode="nologprobs") as a, StubServer(engine="llama.cpp", answer=OTHER_FIRST_TOKEN) as b:
        r = nondet("probe", "--endpoint", a.url, "--against", b.url, "--runs", "1", "-n", "4", "--rate", "50",
                   "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "run" / "report.md").read_text()
    assert "**Cross-engine comparison, not batch variance: A is an unrecognized engine" in report
    assert "reference chose `  alpha ` (logprob —, top1−top2 margin —)" in report
