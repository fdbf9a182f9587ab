"""Against a real server: `transformers serve --continuous-batching` on 127.0.0.1 (CPU), serving a
model this test saves to a temp dir. 16 concurrent greedy copies of one prompt plus filler
traffic must give more than one distinct completion, and a branch point. The server is
stopped by its own process id at the end, also when the test fails."""

import json

import pytest
from serve_fixtures import transformers_serve

from nondet.probes.core.load_config import LoadConfig
from nondet.probes.probe import ProbeConfig, run_probe


SERVED_TOKENS = 300  # enough generated tokens for several near-ties (see served_model_dir)


@pytest.fixture(scope="module")
def served_model_dir(tmp_path_factory):
    # The embedded default's construction (random Qwen3, hidden 512, 4 layers, bf16), saved with
    # save_pretrained. At hidden 64 the server's CPU numerics flipped no token in 64 steps. At this
    # size the first split falls at generated token 126 (here: 11/6, 13/4, 15/2, 12/5 of 17), so once
    # in CI all 17 took one branch at 160 tokens; at 300 tokens 3 of 3 trials gave 6-7 distinct
    # completions (later near-ties split the copies again), about 24 s a trial on 2 cores.
    from nondet.probes.models.default_model import DefaultModelSpec, build_default_model

    out = tmp_path_factory.mktemp("served-model")
    build_default_model(DefaultModelSpec(), out)
    return out


@pytest.mark.slow
def test_transformers_serve_under_load_is_batch_variant(served_model_dir, tmp_path):
    with transformers_serve(served_model_dir, tmp_path) as url:
        load = LoadConfig(mode="server", endpoint=url, tokenizer=str(served_model_dir), rate=8.0)
        result = run_probe(ProbeConfig(max_new_tokens=SERVED_TOKENS, runs=16, out=str(tmp_path / "run"), load=load))
    summary = result.summary
    m = summary["modes"]["default"]
    assert summary["load"]["compare_level"] == "tokenizer"  # transformers serve returns no logprobs
    assert m["numeric_na"] == "server returned no logprobs" and m["first_numeric_divergence"] is None
    assert m["n_runs"] == 17
    assert m["distinct_completions"] > 1, summary["verdict"]
    tree = m["branch_tree"]
    assert tree is not None and len(tree["alternatives"]) >= 2
    assert tree["step"] == m["first_token_divergence"]
    fp = json.loads((tmp_path / "run" / "fingerprint.json").read_text())
    assert fp["load"]["server"]["completion_headers"]["server"] == "uvicorn"
    assert str(served_model_dir) in fp["model"]["name"]  # from the answer: its /v1/models lists no local dirs
