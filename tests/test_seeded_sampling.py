"""Seeded sampling: a flip from the logits' bits vs one from the sampler's random stream.

--sampler shared draws every row of a batch from one generator (transformers' batched sampling,
a server that ignores per-request seeds): row 0's draws then depend on the batch size even where
its logits are bit-identical, and the verdict must name the sampler. --sampler per-request (the
default, the fix) gives each request its own generator: under the mode the tokens match. The
per-request test's control is the shared sampler on the same case: it must flip.
"""

import json

import pytest
from controls import FIX_KERNELS, require_divergence

import cli_runner
from nondet.probes.core.flip_cause import flip_cause, flip_causes
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe

PROMPT = "The quick brown fox jumps over the lazy dog"


def _step(token, logprob="-0x1p+0", top=((1, "-0x1p+0"), (2, "-0x1p+1")), margin="0x1p-1"):
    return {"token": token, "logprob": logprob, "top": [list(t) for t in top], "margin": margin}


def _stream(run_id, steps, reference=False):
    return {"run_id": run_id, "condition_id": f"c{run_id}", "kernels": "default", "position": 0,
            "is_reference": reference, "prompt_id": 0, "steps": steps}


def test_same_distribution_other_token_is_the_sampler():
    ref = _stream(0, [_step(1), _step(1)], True)
    assert flip_cause(ref, _stream(1, [_step(1), _step(2, "-0x1p+1")])) == "sampler"


def test_a_distribution_that_differs_is_the_numerics():
    ref = _stream(0, [_step(1), _step(1)], True)
    other_top = _step(2, "-0x1p+1", top=((1, "-0x1.0000000000001p+0"), (2, "-0x1p+1")))
    assert flip_cause(ref, _stream(1, [_step(1), other_top])) == "numerics"
    earlier_bits = _step(1, "-0x1.0000000000001p+0")  # same token, other logprob bits before the flip
    assert flip_cause(ref, _stream(2, [earlier_bits, _step(2, "-0x1p+1")])) == "numerics"


def test_no_flip_and_no_distribution():
    ref = _stream(0, [_step(1)], True)
    assert flip_cause(ref, _stream(1, [_step(1)])) is None
    bare = {"token": 2, "logprob": None, "top": None, "margin": None}
    assert flip_cause(ref, _stream(2, [bare])) == "unknown"
    assert flip_causes([ref, _stream(1, [_step(1)])]) is None


def _probe(out, model_dir, sampler):
    """fp32: the host's fp32 GEMMs differ between one row and several (the kernels' control)."""
    config = ProbeConfig(prompt=PROMPT, model=ModelSpec(str(model_dir), dtype="float32"), batch_sizes=(1, 2, 4),
                         max_new_tokens=16, temperature=1.0, seed=3, sampler=sampler,
                         kernels=tuple(dict.fromkeys(("default", FIX_KERNELS))), out=str(out), threads=1)
    return run_probe(config).summary


@pytest.fixture(scope="module")
def sampled(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("sampling")
    return {s: _probe(root / s, tiny_model_dir, s) for s in ("shared", "per-request")}


def test_a_shared_generator_flips_with_bit_identical_logits_and_the_verdict_names_it(sampled):
    mode = sampled["shared"]["modes"][FIX_KERNELS]
    assert mode["distinct_completions"] > 1  # the control: one stream for the batch moves row 0's draws
    if FIX_KERNELS == "batch-invariant":  # the logits are the reference's at every flip: the sampler's doing
        assert mode["flip_causes"] == {"sampler": mode["confidence"]["diverged"]}
    assert sampled["shared"]["sampling"] == {"temperature": 1.0, "seed": 3, "sampler": "shared"}


def test_per_request_generators_give_the_references_tokens_under_the_mode(sampled):
    assert sampled["shared"]["modes"][FIX_KERNELS]["distinct_completions"] > 1  # the sampler's control
    require_divergence(sampled["per-request"]["modes"]["default"], "fp32 sampling at batch sizes 1, 2, 4")
    mode = sampled["per-request"]["modes"][FIX_KERNELS]
    assert mode["distinct_completions"] == 1 and mode["first_numeric_divergence"] is None
    assert "flip_causes" not in mode


def test_the_terminal_and_report_say_the_sampler(tmp_path, tiny_model_dir):
    out = tmp_path / "r"
    done = cli_runner.run(["probe", "--model", str(tiny_model_dir), "-p", PROMPT, "-b", "1,2,4", "-n", "12",
                           "--temperature", "1", "--sampler", "shared", "--kernels", "batch-invariant",
                           "--out", str(out)])
    assert done.returncode == 0, done.stderr
    flat = " ".join(done.stdout.split())
    assert "the sampler chose another token, not the kernels" in flat and "--sampler per-request" in flat
    assert "the sampler chose another token" in " ".join((out / "report.md").read_text().split())
    assert json.loads((out / "config.json").read_text())["config"]["sampler"] == "shared"


@pytest.mark.parametrize("args, words", [(["--sampler", "shared"], "needs --temperature > 0"),
                                         (["--sampler", "one", "--temperature", "1"], "--sampler must be one of")])
def test_bad_sampler_settings_are_one_line(tmp_path, args, words):
    done = cli_runner.run(["probe", "-b", "1", "-n", "2", "--out", str(tmp_path / "r"), *args])
    assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr


def test_a_server_probe_sends_every_copy_the_same_seed(tmp_path):
    import sys
    from pathlib import Path

    from nondet.probes.core.load_config import LoadConfig

    sys.path.insert(0, str(Path(__file__).parent))
    from stub_server import StubServer

    with StubServer() as stub:
        load = LoadConfig(mode="server", endpoint=stub.url, rate=100.0, timeout=5.0)
        summary = run_probe(ProbeConfig(max_new_tokens=4, runs=3, temperature=0.7, seed=11, out=str(tmp_path / "r"),
                                        load=load)).summary
        greedy = run_probe(ProbeConfig(max_new_tokens=4, runs=1, out=str(tmp_path / "g"), load=load)).summary
    from nondet.probes.probe import DEFAULT_PROMPT

    sampled = [b for b in stub.received if b.get("temperature") == 0.7 and b.get("prompt") == DEFAULT_PROMPT]
    assert len(sampled) == 4 and all(b["seed"] == 11 for b in sampled)  # the reference and 3 copies (not fillers)
    assert not any("seed" in b for b in stub.received if b.get("temperature") == 0.0)
    assert summary["sampling"] == {"temperature": 0.7, "seed": 11, "sampler": "server"}
    assert "sampling" not in greedy


def test_the_sampler_line_names_the_way_the_run_sampled():
    from nondet.verdict import sampler_line, sampler_lines

    assert sampler_line("default kernels", {"numerics": 2}, "shared") is None  # no flip was the sampler's
    assert "--sampler per-request" in sampler_line("x", {"sampler": 1}, "shared")
    assert "the server ignores or shares seeds" in sampler_line("server", {"sampler": 2, "numerics": 1}, "server")
    summary = {"sampling": {"sampler": "server"}, "modes": {"default": {"flip_causes": {"sampler": 1}}}}
    assert sampler_lines(summary) == [sampler_line("default kernels", {"sampler": 1}, "server")]
