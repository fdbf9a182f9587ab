"""The trained demo model end to end, as a new user meets it: `nondet probe --confirm` with no options,
then bisect, the report and the gate, on SmolLM2-135M-Instruct (scripts/setup.sh installs its GGUF).

The rest of the suite runs on the random-weight demo (conftest.py sets NONDET_DEMO_MODEL=random);
these tests ask for the trained one. It carries the batch-variant norm on purpose, so the effect
shows on any CPU (positive control); the batch-invariant mode must remove it (negative control).
Measured on a 2-core AMD EPYC (AVX2), 2026-11-24: the probe 34 s per kernels mode, bisect 38 s. On a 2-core AMD
EPYC with AVX2 only, 2026-12-02, idle: the probe 295 s (359 s with the demo's first conversion), of it the mode's
row-blocked CPU matmul 178 s (bf16 without bf16 instructions, every call 16 rows: kernels/cpu.py); beside two
other pytest-xdist workers on those 2 cores it passed 900 s (CI, 2026-12-02 05:00).
"""

import json
import os
import re

import pytest

from nondet.probes.models import demo_model
import cli_runner

TRAINED = {"NONDET_DEMO_MODEL": "trained"}
pytestmark = pytest.mark.slow  # a real 135M model end to end: scripts/test.sh --slow (CI runs it)


def nondet(*args, cwd=None):
    return cli_runner.run(args, cwd=cwd, env={**os.environ, **TRAINED, "COLUMNS": "200"}, timeout=2400)


@pytest.fixture(scope="module")
def confirmed(tmp_path_factory):
    assert demo_model.available(), f"the trained demo model is not installed: {demo_model.INSTALL_HINT}"
    run = tmp_path_factory.mktemp("demo") / "run"
    return nondet("probe", "--confirm", "--out", str(run)), run


def test_the_demo_probe_shows_readable_branches_and_the_mode_removes_them(confirmed):
    r, run = confirmed
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((run / "summary.json").read_text())
    default, mode = summary["modes"]["default"], summary["modes"]["batch-invariant"]
    assert max(p["distinct_completions"] for p in default["prompts"]) >= 2
    assert all(p["distinct_completions"] == 1 and p["first_numeric_divergence"] is None for p in mode["prompts"])
    branch = next(line for line in r.stdout.splitlines() if ": branch at step " in line)
    assert re.search(r"[A-Za-z]+ [A-Za-z]+ [A-Za-z]+", branch), branch  # English words, not byte soup
    assert "model: the demo model SmolLM2-135M-Instruct (trained), with model.layers.1.post_attention_layernorm " \
           "made batch-variant on purpose" in r.stdout.replace("\n", " ")
    config = json.loads((run / "config.json").read_text())["config"]
    assert config["chat"] is True and config["prompts"][0] == "Tell me about Richard Feynman."


def host_bf16_matmul_is_batch_variant() -> bool:
    """Whether this CPU's default bf16 matmul gives row 0 of the demo's lm_head shape (576 -> 49152) other
    bits in a batch of 4 than alone: on CPUs without bf16 instructions (an AVX-512 Xeon without
    avx512_bf16, 2026-11-28) it does, and then the demo's divergence has a second cause of the host's own."""
    import torch
    from controls import row0_differs

    torch.manual_seed(0)
    x = torch.randn(4, 576, dtype=torch.bfloat16)
    w = torch.randn(49152, 576, dtype=torch.bfloat16) * 576 ** -0.5
    return bool(row0_differs(lambda t: torch.nn.functional.linear(t, w), x, [4]))


def test_bisect_blames_the_norm_and_the_report_names_the_model(confirmed):
    _, run = confirmed
    r = nondet("bisect", str(run))
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(line for line in r.stdout.splitlines() if line.startswith("minimal set that removes the divergence: "))
    classes = set(line.split(": ", 1)[1].split(" + "))
    assert "norm" in classes, line  # the injected norm, on every host
    # and the matmul where this host's own matmul is batch-variant (checked here, not assumed). The check is
    # one-way: on a 2-core AMD EPYC with AVX512-BF16 (2026-11-30) bisect also named the matmul (the ablation
    # with the norm alone kept a divergence born in model.layers.1.mlp.down_proj at step 1) while this
    # shape's check on random data gave row 0 the same bits: that host's bf16 product of M = 1 and M = 4
    # differs only on some values (the demo's own activations and weights; docs/benchmarks.md, 2026-11-30)
    assert classes <= {"norm", "matmul"}, line
    if host_bf16_matmul_is_batch_variant():
        assert "matmul" in classes, line
    assert nondet("report", str(run)).returncode == 0
    report = (run / "report.md").read_text()
    assert "SmolLM2-135M-Instruct" in report and "Branch tree" in report


def test_the_gate_fails_the_variant_demo_and_passes_it_under_the_mode(tmp_path):
    quick = ("-p", "Tell me about Richard Feynman.", "-b", "1,4", "-n", "24", "--inject-variance", "--no-bisect")
    variant = nondet("gate", *quick, "--out", str(tmp_path / "variant"))
    assert variant.returncode == 1, variant.stdout + variant.stderr
    fixed = nondet("gate", *quick, "--kernels", "batch-invariant", "--out", str(tmp_path / "fixed"))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def test_the_demo_in_float32_is_checked_and_confirmed(tmp_path):
    """In fp32 the mode's kernel check accepts the demo with its injected norm (whose split sum once ran in bf16
    and moved the fp32 logits past fp32 rounding, so `--dtype float32 --confirm` was refused), the default's
    divergence is found and the mode removes it."""
    run = tmp_path / "fp32"
    r = nondet("probe", "--dtype", "float32", "--confirm", "-p", "Tell me about Richard Feynman.", "-b", "1,3",
               "-n", "8", "--out", str(run))
    assert r.returncode == 0, r.stdout + r.stderr
    modes = json.loads((run / "summary.json").read_text())["modes"]
    assert modes["default"]["first_numeric_divergence"] is not None
    assert modes["batch-invariant"]["first_numeric_divergence"] is None


def test_chat_ids_are_the_chat_templates(tmp_path):
    """`--chat` in process feeds the ids apply_chat_template(tokenize=True) gives: what transformers
    serve's /v1/chat/completions feeds the model for the same messages."""
    from transformers import AutoTokenizer

    from nondet.probes.core.batch import tokenize_inputs
    from nondet.probes.core.chat import chat_messages, model_texts

    tokenizer = AutoTokenizer.from_pretrained(demo_model.demo_model_dir())
    for system in (None, "You answer in one sentence."):
        text = model_texts(tokenizer, ["Why is the sky blue?\nAnswer briefly."], True, system)[0]
        served = tokenizer.apply_chat_template(chat_messages("Why is the sky blue?\nAnswer briefly.", system),
                                               tokenize=True, add_generation_prompt=True)
        served = served["input_ids"] if isinstance(served, dict) or hasattr(served, "keys") else served
        assert tokenize_inputs(tokenizer, text, ())[0] == list(served)
    assert model_texts(tokenizer, ["raw"], False) == ["raw"]  # no --chat: the text as given


def test_without_the_package_the_demo_falls_back_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv("NONDET_DEMO_MODEL", "trained")
    monkeypatch.setattr(demo_model, "available", lambda: False)
    path = demo_model.resolve_demo_dir()
    assert (path / "nondet-default.json").exists()  # the random-weight model
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("nondet")]  # not transformers'
    assert ours == [f"nondet: the trained demo model needs `{demo_model.INSTALL_HINT}` (scripts/setup.sh installs "
                   "it); using the random-weight demo model"]
