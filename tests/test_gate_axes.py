"""The gate's speculative and rl axes: policy, config, end to end.

Positive controls on every host: --inject-variance makes one RMSNorm batch-variant on purpose
(kernels/variant.py), so a k+1 verification chunk, or a teacher-forced prefill, takes another
path than a one-row decode whatever the host's BLAS does; the mode's norm class fixes it.
"""

import json
import re
import xml.etree.ElementTree as ET

import pytest

from nondet.errors import UsageError
from nondet.gate.config import load_config, resolve
from nondet.gate.policy import Policy, evaluate
from tests.gate_fixtures import summary_of, sweep
from tests.test_gate_cli import gate

PAIR = {"kernels": "default", "sampler": "default", "trainer_condition": "default/trainer/mb4/right",
        "micro_batch": 4, "padding": "right", "prompt_ids": [0, 1], "n_tokens": 8, "n_identical": 6,
        "frac_identical": 0.75, "dlogp_max": 0.5, "dlogp_mean": 0.1, "dlogp_p95": 0.4, "ratio_outside_0.1": 0.25,
        "ratio_outside_0.2": 0.125, "kl_k1": 0.01, "kl_k2": 0.02, "kl_k3": 0.015, "seqs_differ": 1,
        "first_diff": [None, 2]}
SAME = {**PAIR, "trainer_condition": "default/trainer/mb1/right", "micro_batch": 1, "n_identical": 8,
        "frac_identical": 1.0, "dlogp_max": 0.0, "kl_k3": 0.0, "seqs_differ": 0, "first_diff": [None, None]}
RL_SUMMARY = {"modes": {}, "verdict": "", "rl": {"pairs": [SAME, PAIR]}}


# -- policy ---------------------------------------------------------------------------------

def test_rl_identical_fails_each_pair_whose_bits_differ():
    v = evaluate(RL_SUMMARY, None, Policy(axis="rl"))
    assert [(c.condition_id, c.passed, c.n_runs, c.first_numeric_divergence) for c in v.conditions] == [
        ("default/trainer/mb1/right", True, 2, None), ("default/trainer/mb4/right", False, 2, 2)]
    assert v.message == (
        "policy violated (rl: identical): 1 of 2 condition(s) fail; default/trainer/mb4/right: 2 of 8 sampled "
        "tokens' logprob bits differ from the sampler's at micro-batch 4, first at token 2 of sequence 1 "
        "(prompt 1); max |dlogp| 0.5, k3 KL 0.015, 12.5% of ratios outside 1 +- 0.2")


def test_rl_max_kl_judges_the_k3_estimate():
    assert evaluate(RL_SUMMARY, None, Policy("max-kl", 0.015, "rl")).passed
    v = evaluate(RL_SUMMARY, None, Policy("max-kl", 0.01, "rl"))
    assert v.failures[0].message.startswith("k3 KL 0.015 > 0.01 at micro-batch 4 (2 of 8 tokens' bits differ)")
    assert v.message.startswith("policy violated (rl: max-kl = 0.01): 1 of 2")
    nan = {"modes": {}, "rl": {"pairs": [{**SAME, "kl_k3": float("nan")}]}}
    assert not evaluate(nan, None, Policy("max-kl", 1.0, "rl")).passed
    assert evaluate({"modes": {}, "rl": {"pairs": [SAME]}}, None, Policy(axis="rl")).message == \
        "policy met (rl: identical): 1 condition(s) agree with the sampler"


@pytest.mark.parametrize("make, message", [
    (lambda: Policy("max-distinct", 2, "rl"), "rl requirement must be one of identical, max-kl, not 'max-distinct'"),
    (lambda: Policy("max-kl", 1.0), "requirement must be one of identical, max-distinct, min-divergence-step, "
                                    "max-logprob-diff, max-flip-rate, not 'max-kl'"),
    (lambda: Policy("max-kl", -1.0, "rl"), "max-kl must be >= 0, not -1"),
    (lambda: Policy(axis="beam"), "axis must be one of batch, speculative, rl, not 'beam'"),
])
def test_bad_policies_are_usage_errors(make, message):
    with pytest.raises(UsageError) as err:
        make()
    assert str(err.value) == message


def test_an_axis_judges_only_its_own_runs():
    probe = summary_of(sweep())
    with pytest.raises(UsageError, match="^a rl policy cannot judge a probe run"):
        evaluate(probe, [], Policy(axis="rl"))
    with pytest.raises(UsageError, match=r"^a batch policy cannot judge an rl run \(use rl = ... or max-kl\)$"):
        evaluate(RL_SUMMARY, None, Policy())
    with pytest.raises(UsageError, match="^a speculative policy needs a run of `nondet probe --speculative FORMS`$"):
        evaluate(probe, [], Policy(axis="speculative"))


# -- config ---------------------------------------------------------------------------------

def settings(tmp_path, text: str, **flags):
    path = tmp_path / "nondet.toml"
    path.write_text(text)
    return resolve(flags, load_config(path), path)


def test_file_keys_name_the_axes_and_their_policies(tmp_path):
    s = settings(tmp_path, 'speculative = "max-logprob-diff = 1e-3"\nspeculative-forms = "self:4"\n'
                           'max-kl = 1e-6\nmicro-batch = "1,4"\nsampler-batch = 2\n')
    assert s.axes == ("speculative", "rl")
    assert s.speculative_policy == Policy("max-logprob-diff", 1e-3, "speculative") and s.speculative_forms == "self:4"
    assert s.rl_policy == Policy("max-kl", 1e-6, "rl") and (s.micro_batches, s.sampler_batch) == ((1, 4), 2)
    assert settings(tmp_path, 'require = "identical"\nrl = "identical"\n').axes == ("batch", "rl")
    assert settings(tmp_path, "").axes == ("batch",)


def test_flags_that_name_an_axis_win_over_the_file(tmp_path):
    s = settings(tmp_path, 'rl = "identical"\nrequire = "identical"\n', **{"speculative-forms": "ngram:2"})
    assert s.axes == ("speculative",) and s.speculative_forms == "ngram:2" and s.speculative_policy.axis == "speculative"
    s = settings(tmp_path, 'rl = "identical"\n', **{"max-kl": 0.5})
    assert s.axes == ("rl",) and s.rl_policy == Policy("max-kl", 0.5, "rl")


@pytest.mark.parametrize("text, message", [
    ('max-kl = "x"\n', "{path}: max-kl must be a number, not 'x'"),
    ("max-kl = -1\n", "{path}: max-kl must be >= 0, not -1"),
    ('rl = "identical"\nmax-kl = 0.1\n', "{path}: give one rl requirement, not rl and max-kl"),
    ('rl = "max-distinct = 2"\n', "{path}: rl requirement must be one of identical, max-kl, not 'max-distinct'"),
    ("rl = true\n", "{path}: rl must be a string such as 'identical' or 'max-kl = 0.001', not True"),
    ('speculative = "max-kl = 1"\n', "{path}: speculative requirement must be one of identical, max-distinct, "
                                     "min-divergence-step, max-logprob-diff, not 'max-kl'"),
    ('speculative-forms = "beam:4"\n', "{path}: speculative-forms: unknown form 'beam:4'; use ngram:K, self:K, "
                                       "draft[:K] or draft:MODEL[:K]"),
    ("micro-batch = [0]\n", "{path}: micro-batch must be sizes >= 1, as [1, 4, 8] or '1,4,8'"),
])
def test_bad_axis_values_in_the_file_exit_2_with_one_line(tmp_path, text, message):
    (tmp_path / "nondet.toml").write_text(text)
    r = gate(cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == f"nondet: error: {message.format(path=tmp_path / 'nondet.toml')}\n"
    assert r.stdout == ""


# -- end to end -------------------------------------------------------------------------------

VERDICT = re.compile(r"^nondet gate: policy (met|violated) .*$", re.M)


@pytest.fixture(scope="module")
def speculative_violated(tmp_path_factory, default_model_dir):
    """The speculative axis from the file, default kernels, one norm made batch-variant: under GitHub Actions."""
    work = tmp_path_factory.mktemp("gate-spec")
    (work / "nondet.toml").write_text('speculative = "identical"\nspeculative-forms = "self:4"\n'
                                      "inject-variance = true\nmax-new-tokens = 12\n")
    summary = work / "step-summary.md"
    r = gate("--no-bisect", "--junit", "junit.xml", "--out", "run", cwd=work,
             env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    return r, work


def test_speculative_positive_control_exits_1_naming_the_condition(speculative_violated):
    r, work = speculative_violated
    assert r.returncode == 1, r.stderr
    assert "nondet:" not in r.stderr  # no error, no warning (transformers' assisted decoding may warn)
    line = VERDICT.search(r.stdout).group()
    assert line.startswith("nondet gate: policy violated (speculative: identical): 1 of 1 condition(s) fail; "
                           "default/spec/self4: ")
    assert line.split("default/spec/self4: ")[1].startswith(("same tokens, but logprob bits differ from step ",
                                                             "first token divergence at step "))
    verdict = json.loads((work / "run" / "gate.json").read_text())
    assert verdict["policy"] == {"require": "identical", "value": None, "axis": "speculative"}
    assert [c["condition_id"] for c in verdict["conditions"] if not c["passed"]] == ["default/spec/self4"]


def test_speculative_junit_and_annotations(speculative_violated):
    r, work = speculative_violated
    case = ET.parse(work / "junit.xml").getroot().find("testsuite/testcase")
    assert (case.get("classname"), case.get("name")) == ("nondet.gate.speculative.default", "default/spec/self4")
    assert case.find("failure") is not None
    errors = [line for line in r.stdout.splitlines() if line.startswith("::error ")]
    assert len(errors) == 1
    assert errors[0].startswith("::error title=nondet gate%3A default/spec/self4 [speculative]::speculative: identical: ")
    assert (work / "step-summary.md").read_text().startswith(
        "## nondet gate: ❌ policy violated (speculative: identical)")


def test_speculative_negative_control_batch_invariant_exits_0(tmp_path, default_model_dir):
    r = gate("--speculative", "ngram:4,self:4", "--inject-variance", "--kernels", "batch-invariant", "-n", "12",
             "--junit", "junit.xml", "--out", "run", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert VERDICT.search(r.stdout).group() == \
        "nondet gate: policy met (speculative: identical): 2 condition(s) agree with the reference"
    names = [c.get("name") for c in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")]
    assert names == ["batch-invariant/spec/ngram4", "batch-invariant/spec/self4"]


RL_FLAGS = ["-p", "Tell me about Richard Feynman", "-p", "Hello there", "-n", "4", "--micro-batch", "1,4",
            "--sampler-batch", "1", "--inject-variance", "--no-bisect"]


@pytest.fixture(scope="module")
def rl_violated(tmp_path_factory, tiny_model_dir):
    work = tmp_path_factory.mktemp("gate-rl")
    (work / "nondet.toml").write_text('rl = "identical"\n')
    return gate("--model", str(tiny_model_dir), *RL_FLAGS, "--junit", "junit.xml", "--out", "run", cwd=work), work


def test_rl_positive_control_exits_1_naming_the_micro_batch(rl_violated):
    r, work = rl_violated
    assert r.returncode == 1, r.stderr
    line = VERDICT.search(r.stdout).group()
    assert re.match(r"nondet gate: policy violated \(rl: identical\): 2 of 2 condition\(s\) fail; "
                    r"default/trainer/mb1/right: \d+ of 8 sampled tokens' logprob bits differ from the sampler's "
                    r"at micro-batch 1, first at token \d of sequence \d \(prompt \d\); max \|dlogp\| ", line), line
    suite = ET.parse(work / "junit.xml").getroot().find("testsuite")
    assert [(c.get("classname"), c.get("name"), c.find("failure") is not None) for c in suite.iter("testcase")] == [
        ("nondet.gate.rl.default", "default/trainer/mb1/right", True),
        ("nondet.gate.rl.default", "default/trainer/mb4/right", True)]
    assert json.loads((work / "run" / "gate.json").read_text())["policy"]["axis"] == "rl"


def test_read_tables_reads_the_rl_run(rl_violated):
    from nondet.reports import read_tables

    t = read_tables(rl_violated[1] / "run")
    assert t.is_rl and list(t.rl.micro_batch) == [1, 4] and list(t.rl.kernels) == ["default", "default"]
    assert list(t.rl.n_tokens) == [8, 8] and not t.rl.bit_identical.any()
    assert (t.rl.kl_k3 > 0).all() and (t.rl["ratio_out_0.2"] >= 0).all() and (t.rl.dlogp_max > 0).all()
    assert set(t.streams.condition_id) >= {"default/trainer/mb4/right"} and t.gate["passed"] is False


def test_rl_negative_control_batch_invariant_exits_0(tmp_path, tiny_model_dir):
    r = gate("--model", str(tiny_model_dir), *RL_FLAGS, "--rl", "--kernels", "batch-invariant", "--out", "run",
             cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert VERDICT.search(r.stdout).group() == \
        "nondet gate: policy met (rl: identical): 2 condition(s) agree with the sampler"
    from nondet.reports import read_tables

    assert read_tables(tmp_path / "run").rl.bit_identical.all()


@pytest.mark.slow
def test_rl_max_kl_zero_fails_and_a_loose_bound_passes(tmp_path, tiny_model_dir):
    r = gate("--model", str(tiny_model_dir), *RL_FLAGS, "--max-kl", "0", "--out", "run0", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert re.search(r"^nondet gate: policy violated \(rl: max-kl = 0\.0\): 2 of 2 condition\(s\) fail; "
                     r"default/trainer/mb1/right: exact KL \S+ > 0 at micro-batch 1", r.stdout, re.M), r.stdout
    r = gate("--model", str(tiny_model_dir), *RL_FLAGS, "--max-kl", "1", "--out", "run1", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nondet gate: policy met (rl: max-kl = 1.0): 2 condition(s) agree with the sampler" in r.stdout


def test_max_kl_judges_the_exact_kl_when_the_run_kept_it():
    exact = {"modes": {}, "rl": {"pairs": [{**PAIR, "kl_exact": 0.002, "kl_exact_max": 0.01}]}}
    assert evaluate(exact, None, Policy("max-kl", 0.005, "rl")).passed  # k3 (0.015) alone would fail it
    v = evaluate(exact, None, Policy("max-kl", 0.001, "rl"))
    assert not v.passed and "exact KL 0.002 > 0.001" in v.failures[0].message
