"""bisect on a speculative condition, and assert_speculative_equivalent.

The positive control does not depend on this host's BLAS: --inject-variance makes one RMSNorm
take a split path whenever several rows share the call (kernels/variant.py), as a k+1
verification chunk does, while a one-token decode takes the one-row path.
"""

import json
import os
import re
import shutil

import pytest
import torch

from nondet.probes.bisect import BisectConfig
from nondet.probes.bisect_probe import run_bisect
from nondet.probes.speculative.bisect import verify_schedule, step_rows, stream_rounds
from nondet.pytest_plugin import assert_speculative_equivalent, first_difference
import cli_runner

PROMPT = "Tell me about Richard Feynman"
NORM = "model.layers.1.post_attention_layernorm"


def nondet(*args):
    return cli_runner.run(args, env=dict(os.environ), timeout=600)


# -- units: rounds and rows ---------------------------------------------------------------


def test_rounds_come_from_the_streams_round_fields():
    steps = [{"round": r} for r in (0, 0, 0, 0, 0, 1, 1, 2)]
    stream = {"steps": steps, "drafted": [4, 4, 0]}
    assert stream_rounds(stream) == [(4, 5), (4, 2), (0, 1)]
    assert verify_schedule([(4, 5), (4, 2), (0, 1)], 6) == [(4, 5), (4, 2)]
    assert verify_schedule([(4, 5)], 12) == [(4, 5), (4, 5), (4, 5)]  # past the stream: its last draft length


def test_step_rows_cut_a_chunk_into_logical_positions():
    chunk = torch.arange(8, 13)[:, None]  # a forward over positions 8..12 (each row holds its position)
    assert step_rows(chunk, 8, 13, 10, 11).flatten().tolist() == [10]
    logits = torch.arange(10, 13)[:, None]  # logits of the last 3 positions only
    assert step_rows(logits, 8, 13, 9, 10) is None
    assert step_rows(logits, 8, 13, 12, 13).flatten().tolist() == [12]
    prefill = torch.arange(9)[:, None]  # round 0: prompt 0..4 + 4 drafts; step 0 = the prompt
    assert step_rows(prefill, 0, 9, 0, 5).flatten().tolist() == [0, 1, 2, 3, 4]
    assert step_rows(torch.zeros(7, 2), 8, 13, 10, 11) is None  # more rows than positions: not positional


# -- bisect on `nondet probe --speculative self:4 --inject-variance` ------------------------


@pytest.fixture(scope="module")
def spec_run(tmp_path_factory, default_model_dir):
    out = tmp_path_factory.mktemp("specbisect") / "R"
    r = nondet("probe", "--speculative", "self:4", "-p", PROMPT, "--inject-variance", "-n", "16", "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def _copy(run, tmp_path):
    return shutil.copytree(run, tmp_path / "R")


def test_bisect_names_the_injected_norm_and_its_ablation_removes_it(spec_run, tmp_path):
    """With every other op class batch-invariant (the baseline), what remains is the injected norm:
    born at step 1 (the first token through a verification chunk), removed by the norm class."""
    run = _copy(spec_run, tmp_path)
    b = run_bisect(BisectConfig(str(run), baseline=("matmul", "attention", "softmax"))).bisect
    assert b["condition_id"] == "default/spec/self4" and b["speculative"]["form"] == "self:4"
    assert (b["origin"]["step"], b["origin"]["module"], b["origin"]["op_class"]) == (1, NORM, "norm")
    assert b["lasting"]["module"] == NORM and b["lasting"]["via"] == "kv cache"
    assert b["speculative"]["chunk_rows"] == [1, 5] and b["speculative"]["acceptance_rate"] == 1.0
    [norm] = b["ablation"]
    assert norm["ops"] == ["norm"] and norm["activations_match"] and norm["origin_removed"]
    assert b["minimal_set"] == ["norm"]
    written = json.loads((run / "bisect.json").read_text())
    assert written["origin"] == b["origin"] and json.loads((run / "ablation.json").read_text())["minimal_set"] == ["norm"]


def test_bisect_replay_reproduces_the_probes_numerics(spec_run, tmp_path):
    """The replayed reference gives the probe's tokens; the replay's first logprob difference is the probe's."""
    run = _copy(spec_run, tmp_path)
    b = run_bisect(BisectConfig(str(run), ablation=False, max_steps=4)).bisect
    assert b["reference_reproduced"] is True
    assert b["first_logprob_step"] == b["probe_numeric_step"]
    assert b["lasting"]["module"] == NORM or b["origin"]["module"] != NORM  # the host may add earlier matmul bits


def test_cli_bisect_of_a_speculative_run(spec_run, tmp_path):
    run = _copy(spec_run, tmp_path)
    r = nondet("bisect", str(run))
    assert r.returncode == 0, r.stderr
    data = json.loads((run / "bisect.json").read_text())
    origin = data["origin"]
    assert r.stdout.startswith("default/spec/self4 row 0 (run 1) vs reference (run 0)\n")
    assert re.search(rf"(origin|first difference): step {origin['step']}, {re.escape(origin['module'])} "
                     rf"\(op class {origin['op_class']}", r.stdout)
    assert "ablation: reference and divergent condition rerun" in r.stdout
    assert data["minimal_set"] and "norm" in data["minimal_set"]


# -- assert_speculative_equivalent ---------------------------------------------------------


@pytest.fixture(scope="module")
def variant_model(default_model_dir):
    from nondet.probes.models.loading import ModelSpec, load_model

    return load_model(ModelSpec(inject_variance=True))


def test_plugin_fails_naming_prompt_form_and_step(variant_model):
    with pytest.raises(AssertionError) as exc:
        assert_speculative_equivalent(variant_model.model, variant_model.tokenizer, prompts=[PROMPT], k=4,
                                      forms=("self",), max_new_tokens=6)
    message = str(exc.value)
    assert message.startswith("speculative decoding differs from plain greedy decoding (kernels default):\n")
    found = re.search(rf"  prompt '{PROMPT}', form self:4: first differing step (\d+): ", message)
    assert found and int(found.group(1)) <= 1  # step 1 at the latest: the first verification chunk


def test_plugin_passes_under_the_batch_invariant_mode(variant_model):
    passed = assert_speculative_equivalent(variant_model.model, variant_model.tokenizer, prompts=[PROMPT], k=4,
                                           forms=("self", "ngram"), max_new_tokens=8, kernels="batch-invariant")
    assert [(p["form"], p["steps"]) for p in passed] == [("self:4", 8), ("ngram:4", 8)]
    assert passed[0]["acceptance_rate"] == 1.0


def test_plugin_is_a_fixture(assert_speculative_equivalent):
    from nondet import pytest_plugin

    assert assert_speculative_equivalent is pytest_plugin.assert_speculative_equivalent


def test_first_difference_of_step_lists():
    a = [{"token": 1, "logprob": "0x1p+0"}, {"token": 2, "logprob": "0x1p+1"}]
    assert first_difference(a, a) is None
    assert first_difference(a, [a[0], {"token": 2, "logprob": "0x1p+2"}]) == 1
    assert first_difference(a, a[:1]) == 1


def test_lockstep_modules_import_no_private_names_of_others():
    """Shared parts are public (lockstep's RecordSink / CompareSink serve speculative/bisect.py too)."""
    import ast
    from pathlib import Path

    import nondet.probes as package

    private = []
    for path in (Path(package.__file__).parent / name for name in ("bisect/lockstep.py", "speculative/bisect.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nondet"):
                private += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert private == []


def test_rejected_drafts_leave_the_cache_with_a_negative_crop(tiny_model_dir, monkeypatch):
    """Rounds whose drafts are partly rejected (as ngram:4 under the gate; self:4 accepts all, so
    the tests above never crop): transformers' crop takes the count to remove as a NEGATIVE
    number (a positive one raises from 5.18); after each round the cache holds exactly the
    accepted positions, and the teacher-forced replay covers every step."""
    import contextlib

    from transformers import DynamicCache

    from nondet.probes.speculative.bisect import run_speculative_lockstep
    from nondet.probes.models.loading import ModelSpec, load_model

    calls = []
    original = DynamicCache.crop

    def spy(cache, tokens_to_remove):
        before = cache.get_seq_length()
        original(cache, tokens_to_remove)
        calls.append((tokens_to_remove, before, cache.get_seq_length()))

    monkeypatch.setattr(DynamicCache, "crop", spy)
    model = load_model(ModelSpec(str(tiny_model_dir))).model
    prompt = [5, 6, 7, 8, 9]
    rounds = [(4, 2), (4, 1), (3, 4), (0, 1), (2, 3), (4, 1)]  # (drafted, produced): rejections of 3, 4, 0, 0, 0, 4
    ls = run_speculative_lockstep(model, prompt, rounds, 12, contextlib.nullcontext)
    assert ls.steps == 12 and len(ls.reference) == 12
    assert [c[0] for c in calls] == [-3, -4, -4]  # only rounds that rejected something crop, by a negative count
    kept = [len(prompt) + 2 - 1, len(prompt) + 3 - 1, len(prompt) + 12 - 1]  # positions accepted so far, less the last token
    assert [c[2] for c in calls] == kept and all(b - a == -r for r, b, a in calls)
