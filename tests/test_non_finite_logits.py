"""Non-finite logits are a finding, not data (audit D4).

A model whose activations overflow float16 gives NaN logits: recorded as they were, every step read
token 0, logprob 'nan', and the verdict called it "batch-invariant, bit-identical" ('nan' == 'nan').
Now the recorders and samplers stop with NonFiniteLogitsError (exit 3, one line naming the step, the
row and what to try), and the diff never counts a NaN logprob as equal. -inf entries are masked
vocabulary and are recorded as before. Every check has its control: the same model in bfloat16, the
same logits without the NaN.
"""

import os
import shutil

import pytest

import cli_runner
from nondet.errors import NondetError, NonFiniteLogitsError
from nondet.probes.core.diff import first_numeric_divergence, summarize
from nondet.probes.core.recorder import StepRecorder, step_record

PROMPT = "first prompt"  # tokenizes with the tiny test tokenizer


def nondet(*args, cwd=None):
    env = {**os.environ, "GITHUB_ACTIONS": ""}  # the gate's plain output, wherever the tests run
    env.pop("NONDET_DEBUG", None)  # the user's view: one line, no traceback
    return cli_runner.run(args, env=env, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def overflow_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny Qwen3 with layer 0's MLP weights scaled to max |w| 3000: finite in float16, but the
    layer's output overflows float16 (as bf16-trained checkpoints do), so its float16 logits are NaN
    while bfloat16 (float32's range) runs it fine."""
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("overflow") / "model"
    shutil.copytree(tiny_model_dir, out)  # the tokenizer files come along
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        mlp = model.model.layers[0].mlp
        for linear in (mlp.up_proj, mlp.gate_proj, mlp.down_proj):
            linear.weight *= 3e3 / linear.weight.abs().max()
    model.save_pretrained(out)
    ids = torch.tensor([[5, 6, 7]])
    for dtype, nan in ((torch.float16, True), (torch.bfloat16, False)):  # the premise, checked
        logits = AutoModelForCausalLM.from_pretrained(out, dtype=dtype)(ids).logits
        assert bool(logits.isnan().any()) is nan, dtype
    return out


def one_error_line(r) -> str:
    """The user's whole stderr: a single `nondet: error:` line."""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nondet: error: "), r.stderr
    return lines[0]


# -- the CLI: exit 3 and one line in float16, a normal run of the same model in bfloat16 ------------------


@pytest.mark.parametrize("extra", [[], ["--temperature", "0.7"], ["--temperature", "0.7", "--sampler", "shared"],
                                   ["--load", "continuous"], ["--speculative", "ngram:2"]],
                         ids=["greedy", "sampled", "shared-sampler", "continuous", "speculative"])
def test_probe_refuses_nan_logits_and_runs_the_same_model_in_bfloat16(overflow_model_dir, tmp_path, extra):
    one_row = "--load" in extra or "--speculative" in extra  # the continuous engine and speculation take no batch sizes
    case = ["probe", "--model", overflow_model_dir, "-p", PROMPT, "-n", "4", *([] if one_row else ["-b", "1,2"]),
            *extra]
    r = nondet(*case, "--dtype", "float16", "--out", tmp_path / "f16")
    assert r.returncode == 3, r.stdout + r.stderr
    line = one_error_line(r)
    assert "logits are NaN or +inf" in line and "--dtype bfloat16" in line
    # every path knows where: the first step of the reference's row (a later step: test_non_finite_steps.py)
    assert "decode step 0, batch row 0 (model dtype float16)" in line
    control = nondet(*case, "--dtype", "bfloat16", "--out", tmp_path / "bf16")
    assert control.returncode == 0, control.stdout + control.stderr


def test_gate_does_not_pass_on_nan_logits(overflow_model_dir, tmp_path):
    (tmp_path / ".git").mkdir()  # a repository root: no gate config above it is read
    case = ["gate", "--model", overflow_model_dir, "-p", PROMPT, "-n", "4", "-b", "1,2", "--no-bisect"]
    r = nondet(*case, "--dtype", "float16", "--out", "f16", cwd=tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "PASS" not in r.stdout and "policy met" not in r.stdout
    assert "logits are NaN or +inf" in one_error_line(r)
    control = nondet(*case, "--dtype", "bfloat16", "--out", "bf16", cwd=tmp_path)
    assert control.returncode in (0, 1), control.stdout + control.stderr  # a verdict either way (host's kernels)
    assert "nondet gate: policy" in control.stdout


def test_rl_refuses_nan_logits_in_its_sampler(overflow_model_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{PROMPT}\nsecond prompt\n")
    case = ["rl", "--model", overflow_model_dir, "--prompts", prompts, "-n", "4", "--micro-batch", "1",
            "--no-backward"]
    r = nondet(*case, "--dtype", "float16", "--out", tmp_path / "f16")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "logits are NaN or +inf at decode step 0, batch row 0" in one_error_line(r)
    control = nondet(*case, "--dtype", "bfloat16", "--out", tmp_path / "bf16")
    assert control.returncode == 0, control.stdout + control.stderr


def test_rl_continuous_and_the_modes_census_name_the_nan_logits_too(overflow_model_dir, tmp_path):
    """The continuous engine's sampler (torch.multinomial on NaN: exit 70) and the batch-invariant mode's census
    ("changes the logits by up to nan ... refuses this model": blamed on the mode) say what it is. Controls: the
    same runs in bfloat16 exit 0."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{PROMPT}\n")
    cases = (["rl", "--model", overflow_model_dir, "--prompts", prompts, "-n", "4", "--micro-batch", "1",
              "--no-backward", "--load", "continuous"],
             ["probe", "--model", overflow_model_dir, "-p", PROMPT, "-n", "4", "-b", "1,2", "--kernels",
              "batch-invariant"])
    for k, case in enumerate(cases):
        r = nondet(*case, "--dtype", "float16", "--out", tmp_path / f"f16-{k}")
        assert r.returncode == 3 and "logits are NaN or +inf" in one_error_line(r), r.stdout + r.stderr
        control = nondet(*case, "--dtype", "bfloat16", "--out", tmp_path / f"bf16-{k}")
        assert control.returncode == 0, control.stdout + control.stderr


# -- the batched recorder -----------------------------------------------------------------------------------


def _logits(steps: int, rows: int = 4, vocab: int = 300):
    import torch

    torch.manual_seed(0)
    return [torch.randn(rows, vocab) for _ in range(steps)]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "+inf"])
def test_a_non_finite_target_row_stops_at_its_step_and_row(bad):
    steps = _logits(4)
    clean = StepRecorder((1, 3), 4, 0.0, 0)
    for x in steps:
        clean(None, x)
    assert [len(s) for s in clean.steps.values()] == [4, 4]  # control: the same logits, all finite
    steps[2][3, 17] = bad
    rec = StepRecorder((1, 3), 4, 0.0, 0)
    for x in steps:
        rec(None, x)  # nothing checked yet: the flags stay on the device until the steps are read
    with pytest.raises(NonFiniteLogitsError) as err:
        rec.steps
    assert (err.value.step, err.value.row) == (2, 3)
    assert "decode step 2, batch row 3" in str(err.value) and "\n" not in str(err.value)


def test_a_non_finite_filler_row_is_not_a_recorded_row():
    steps = _logits(2)
    steps[1][0, 5] = float("nan")  # row 0 is a filler: its logits are never measured
    rec = StepRecorder((1, 3), 4, 0.0, 0)
    for x in steps:
        rec(None, x)
    assert len(rec.steps[1]) == 2
    steps[1][1, 5] = float("nan")  # the positive control: the same NaN in a target row
    rec = StepRecorder((1, 3), 4, 0.0, 0)
    for x in steps:
        rec(None, x)
    with pytest.raises(NonFiniteLogitsError):
        rec.steps


def test_minus_inf_entries_are_masked_vocabulary_and_recorded_normally():
    import math

    (x,) = _logits(1)
    x[:, ::2] = float("-inf")  # half the vocabulary masked in every row
    rec = StepRecorder((1, 3), 4, 0.0, 0)
    rec(None, x)
    for row in (1, 3):
        assert rec.steps[row] == [step_record(x[row:row + 1], int(x[row].argmax()))]
        assert math.isfinite(float.fromhex(rec.steps[row][0]["logprob"]))
    x[3, 1] = float("nan")  # the positive control: one NaN in the same masked row
    rec = StepRecorder((1, 3), 4, 0.0, 0)
    rec(None, x)
    with pytest.raises(NonFiniteLogitsError):
        rec.steps


def test_a_step_generate_undid_is_not_checked():
    # the deferred stop check (core/deferred_stop.py) runs one step past the end and undoes it: keep_first
    steps = _logits(3)
    steps[2][1, 0] = float("nan")
    rec = StepRecorder((1,), 4, 0.0, 0)
    for x in steps:
        rec(None, x)
    rec.keep_first(2)
    assert len(rec.steps[1]) == 2
    rec = StepRecorder((1,), 4, 0.0, 0)
    for x in steps:
        rec(None, x)
    with pytest.raises(NonFiniteLogitsError):  # the control: kept, the step is checked
        rec.keep_first(3)


def test_step_record_refuses_nan_and_passes_minus_inf():
    (x,) = _logits(1, rows=1)
    x[0, ::3] = float("-inf")
    assert step_record(x, int(x[0].argmax()))["token"] == int(x[0].argmax())
    x[0, 1] = float("nan")
    with pytest.raises(NonFiniteLogitsError):
        step_record(x, 0)


# -- the samplers: the error, never torch.multinomial's RuntimeError on NaN ------------------------------------


@pytest.mark.parametrize("sampler", ["per-request", "shared"])
def test_recorder_sampler_refuses_nan_probabilities(sampler):
    import torch

    steps = _logits(2)
    steps[0][:, ::2] = float("-inf")  # control inside the run: masked entries sample fine
    rec = StepRecorder((1,), 4, 0.7, 0, sampler=sampler)
    forced = rec(None, steps[0])
    assert bool(torch.isfinite(forced.max(dim=-1).values).all())
    steps[1][2, 9] = float("nan")  # a filler row: it is sampled too, so it would reach multinomial
    with pytest.raises(NonFiniteLogitsError) as err:
        rec(None, steps[1])
    assert (err.value.step, err.value.row) == (1, 2)


def test_rl_sample_recorder_refuses_nan_probabilities():
    from nondet.probes.rl.processed import Processing
    from nondet.probes.rl.sampler import SampleRecorder

    steps = _logits(2, rows=2)
    steps[0][:, ::2] = float("-inf")
    rec = SampleRecorder([0, 1], Processing(0.7, top_k=20, top_p=0.9), model_dtype="float16")
    rec(None, steps[0])  # the control: masked entries, a normal step
    assert [len(s) for s in rec.steps.values()] == [1, 1]
    steps[1][1, 4] = float("inf")
    with pytest.raises(NonFiniteLogitsError) as err:
        rec(None, steps[1])
    assert (err.value.step, err.value.row) == (1, 1)
    assert "(model dtype float16)" in str(err.value) and "--dtype bfloat16" in str(err.value)


# -- the error and the diff ---------------------------------------------------------------------------------


def test_the_error_is_an_exit_3_one_line_nondet_error():
    err = NonFiniteLogitsError(4, 2, "torch.float16")
    assert isinstance(err, NondetError) and err.exit_code == 3
    assert str(err) == ("the model's logits are NaN or +inf at decode step 4, batch row 2 (model dtype float16): "
                        "its activations overflow float16; try --dtype bfloat16 or float32")
    assert "(model dtype float32): check the weights" in str(NonFiniteLogitsError(0, 0, "float32"))
    assert "most often" in str(NonFiniteLogitsError(0, 0))  # dtype unknown: the usual cause, hedged


def _stream(run_id, logprobs, ref=False):
    steps = [{"token": 7, "logprob": lp, "margin": float(0.5).hex(), "piece": "x"} for lp in logprobs]
    return {"run_id": run_id, "condition_id": "c", "position": 0, "is_reference": ref, "kernels": "default",
            "steps": steps}


def test_diff_never_counts_nan_logprobs_as_identical():
    same, nan = float(-0.5).hex(), float("nan").hex()
    assert first_numeric_divergence(_stream(0, [same, same], True), _stream(1, [same, same])) is None  # control
    assert first_numeric_divergence(_stream(0, [same, nan], True), _stream(1, [same, nan])) == 1
    assert first_numeric_divergence(_stream(0, [None, None], True), _stream(1, [None, None])) is None  # no logprobs
    summary = summarize([_stream(0, [nan], True), _stream(1, [nan])])
    assert summary["first_numeric_divergence"] == 0
