"""The continuous and speculative probes name the decode step of non-finite logits, as the batched recorder does.

Both record the target's logits one row at a time (recorder.step_record), which refused NaN / +inf with
"at a recorded step": no step, no row. Now each passes the step it is recording (0-based, the recorder's
convention), the row (the target's row among the engine's logits; 0 at speculative batch size 1) and the
model's dtype. The model here has finite logits for two steps and NaN from the third: one token's input
embedding is NaN, the token greedy decoding picks at step 1, so the logits that read it (step 2) are NaN.
Every check has its control: the same run on the model without the NaN exits 0.
"""

import os
import shutil

import pytest

import cli_runner
from nondet.errors import NonFiniteLogitsError

PROMPT = "first prompt"  # tokenizes with the tiny test tokenizer
NAN_STEP = 2  # the first decode step whose logits are NaN (0-based)


def nondet(*args):
    env = {**os.environ, "GITHUB_ACTIONS": ""}
    env.pop("NONDET_DEBUG", None)  # the user's view: one line, no traceback
    return cli_runner.run(args, env=env, timeout=300)


@pytest.fixture(scope="module")
def late_nan_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny Qwen3 (untied embeddings) with the input embedding of its greedy step-1 token set to NaN: that
    token's keys and values are NaN, so the logits of every later position are, from step NAN_STEP on."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nondet.probes.core.chat import prompt_ids

    out = tmp_path_factory.mktemp("late-nan") / "model"
    shutil.copytree(tiny_model_dir, out)  # the tokenizer files come along
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert not model.config.tie_word_embeddings  # a NaN embedding row must not be a NaN output row too
    ids = prompt_ids(AutoTokenizer.from_pretrained(out), PROMPT)
    with torch.no_grad():
        tokens = model.generate(torch.tensor([ids]), max_new_tokens=NAN_STEP, do_sample=False)[0, len(ids):].tolist()
        poisoned = tokens[NAN_STEP - 1]
        assert poisoned not in ids + tokens[:NAN_STEP - 1]  # read first where it is generated
        model.model.embed_tokens.weight[poisoned] = float("nan")
        # the premise, decoded step by step (one forward over all positions is NaN at every one: attention's
        # masked weights are 0, and 0 x NaN is NaN)
        decoded = model.generate(torch.tensor([ids]), max_new_tokens=NAN_STEP + 1, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True)
    logits = torch.cat(decoded.logits)  # [NAN_STEP + 1, vocab]
    assert logits[:NAN_STEP].isfinite().all() and logits[:NAN_STEP].argmax(-1).tolist() == tokens
    assert logits[NAN_STEP].isnan().all()
    model.save_pretrained(out)
    return out


def one_error_line(r) -> str:
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nondet: error: "), r.stderr
    return lines[0]


CASES = {"continuous": ["--load", "continuous", "--runs", "1"],
         "speculative-ngram": ["--speculative", "ngram:2"], "speculative-self": ["--speculative", "self:2"]}


@pytest.mark.parametrize("extra", CASES.values(), ids=CASES.keys())
def test_the_probe_names_the_step_and_row_of_nan_logits(late_nan_model_dir, tiny_model_dir, tmp_path, extra):
    case = ["-p", PROMPT, "-n", "4", "--dtype", "float32", *extra]
    r = nondet("probe", "--model", late_nan_model_dir, *case, "--out", tmp_path / "nan")
    assert r.returncode == NonFiniteLogitsError.exit_code, r.stdout + r.stderr
    assert one_error_line(r) == (f"nondet: error: the model's logits are NaN or +inf at decode step {NAN_STEP}, "
                                 "batch row 0 (model dtype float32): check the weights for NaN or inf, or try "
                                 "--dtype float32")
    control = nondet("probe", "--model", tiny_model_dir, *case, "--out", tmp_path / "clean")
    assert control.returncode == 0, control.stdout + control.stderr


def _config(model_dir, **fields):
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig

    return ProbeConfig(prompt=PROMPT, model=ModelSpec(str(model_dir), dtype="float32"), max_new_tokens=4,
                       kernels=("default",), **fields)


def _replay_speculative(model_dir, form: str) -> None:
    """The assisted condition alone (the CLI stops at the plain reference, which comes first)."""
    from nondet.probes.speculative.source import SpeculativeSource

    source = SpeculativeSource(_config(model_dir, speculative=(form,)))
    source.open()
    (spec,) = [p for p in source.plan() if p.plan[1] is not None]
    source.replay(spec, lambda stream: None)


# ngram:2 drafts from the prompt, where the poisoned token is not: its NaN comes where plain decoding's does.
# self:2 drafts that token in the first round, and the verification pass over prompt + drafts is NaN at every
# row (attention's masked weights are 0, and 0 x NaN is NaN): that condition's own logits are NaN from step 0.
@pytest.mark.parametrize("form, step", [("ngram:2", NAN_STEP), ("self:2", 0)], ids=["ngram", "self"])
def test_a_speculative_condition_names_its_own_step(late_nan_model_dir, tiny_model_dir, form, step):
    _replay_speculative(tiny_model_dir, form)  # the control: no NaN, no error
    with pytest.raises(NonFiniteLogitsError) as err:
        _replay_speculative(late_nan_model_dir, form)
    assert (err.value.step, err.value.row, str(err.value.dtype)) == (step, 0, "torch.float32")


def _replay_continuous_reference(model_dir) -> None:
    """The continuous source's reference: the target alone in the engine, row 0 at every step."""
    from nondet.probes.continuous.source import ContinuousSource

    source = ContinuousSource(_config(model_dir, runs=1))
    source.open()
    try:
        source.replay(source.plan()[0], lambda stream: None)
    finally:
        source.close()


def test_the_continuous_engine_names_the_step_of_the_target(late_nan_model_dir, tiny_model_dir):
    _replay_continuous_reference(tiny_model_dir)  # the control
    with pytest.raises(NonFiniteLogitsError) as err:
        _replay_continuous_reference(late_nan_model_dir)
    assert (err.value.step, err.value.row, str(err.value.dtype)) == (NAN_STEP, 0, "torch.float32")
