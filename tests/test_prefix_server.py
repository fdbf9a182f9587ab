"""The prefix axis against a server (probes/server/prefix.py): per pair, the target on a cold
prefix cache (the pair's reference), a warming request of the prompt's first part, then the target
again. Cold by the engine's reset where it has one (llama.cpp's slot erase on the stub), else by a
unique tag per pair; summary.json and the report say which. The stub's answers are fixed, so these
tests check the protocol and the records; a real server's numerics: test_prefix_served below."""

import json
import sys
from pathlib import Path

import pytest

from nondet.probes.core.load_config import LoadConfig
from nondet.probes.probe import DEFAULT_PROMPT, ProbeConfig, run_probe

sys.path.insert(0, str(Path(__file__).parent))
from serve_fixtures import transformers_serve  # noqa: E402
from stub_server import StubServer  # noqa: E402
import cli_runner  # noqa: E402

PROMPT = "Tell me about Richard Feynman, his childhood in Far Rockaway and his years at Los Alamos"


def _probe(url, out, **load):
    return run_probe(ProbeConfig(prompt=PROMPT, max_new_tokens=4, prefill=("prefix:auto",), out=str(out),
                                 load=LoadConfig(mode="server", endpoint=url, timeout=5.0, **load))).summary


def test_without_a_reset_every_pair_has_its_own_unique_prefix(tmp_path):
    with StubServer() as stub:
        summary = _probe(stub.url, tmp_path / "r")
    bodies = stub.received
    assert len(bodies) == 12  # 4 pairs: cold, warming (1 token), warm
    for pair in range(4):
        cold, warming, warm = bodies[3 * pair: 3 * pair + 3]
        assert cold["prompt"] == warm["prompt"] and cold["prompt"].endswith(PROMPT)
        assert warm["prompt"].startswith(warming["prompt"]) and warming["max_tokens"] == 1
    tags = {b["prompt"].split("]")[0] for b in bodies[::3]}
    assert len(tags) == 4  # no pair shares a prefix with another
    section = summary["prefill"]
    assert section["cold"].startswith("a unique prefix per pair")
    assert [c["size"] for c in section["conditions"]] == sorted(c["size"] for c in section["conditions"])
    assert all(c["distinct_completions"] == 1 for c in section["conditions"])  # the stub's answers are fixed


def test_a_known_reset_makes_every_pair_cold_on_the_target_itself(tmp_path):
    with StubServer(engine="llama.cpp") as stub:
        summary = _probe(stub.url, tmp_path / "r")
    assert stub.resets == [0, 0, 3, 6, 9]  # the check that the reset works, then one before each pair
    assert {b["prompt"] for b in stub.received if b["max_tokens"] == 4} == {PROMPT}
    assert summary["prefill"]["cold"] == "the server's cache reset (POST /slots/0?action=erase)"
    fingerprint = json.loads((tmp_path / "r" / "fingerprint.json").read_text())
    assert fingerprint["load"]["prefix_cache"]["cold"] == summary["prefill"]["cold"]


def test_the_report_says_how_the_cold_cache_was_made(tmp_path):
    with StubServer() as stub:
        _probe(stub.url, tmp_path / "r")
    done = cli_runner.run(["report", str(tmp_path / "r")])
    assert done.returncode == 0, done.stderr
    text = " ".join((tmp_path / "r" / "report.md").read_text().split())
    assert "Cold cache: a unique prefix per pair" in text


@pytest.mark.parametrize("args", [["--chunked-prefill", "4"], ["--prefix-cache", "8"],
                                  ["--prefix-cache", "auto", "--temperature", "1"]])
def test_what_a_server_cannot_take_is_one_line(tmp_path, args):
    with StubServer() as stub:
        done = cli_runner.run(["probe", "--endpoint", stub.url, "-n", "2", "--out", str(tmp_path / "r"), *args])
    assert done.returncode == 2 and "against a server" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_prefix_served(tmp_path):
    """transformers serve (CPU, continuous batching): the axis runs end to end against a live server."""
    from nondet.probes.models.default_model import DefaultModelSpec, build_default_model

    model = tmp_path / "model"
    build_default_model(DefaultModelSpec(), model)
    with transformers_serve(model, tmp_path) as url:
        summary = _probe(url, tmp_path / "r", tokenizer=str(model))
    section = summary["prefill"]
    assert section["cold"].startswith("a unique prefix per pair")  # transformers serve has no reset nondet knows
    assert len(section["conditions"]) == 4 and all(c["size"] > 0 for c in section["conditions"])
    assert summary["modes"]["default"]["n_runs"] == 8
