"""The gate's policy on synthetic summaries: each requirement, its messages, its parsing."""

import pytest

from gate_fixtures import LP, A, B, C, summary_of, sweep
from nondet.errors import UsageError
from nondet.gate import Policy, evaluate


def judge(streams, policy=Policy(), with_streams=True):
    return evaluate(summary_of(streams), streams if with_streams else None, policy)


def by_condition(verdict):
    return {c.condition_id: c for c in verdict.conditions}


def test_identical_streams_meet_identical():
    v = judge(sweep())
    assert v.passed and [c.condition_id for c in v.conditions] == ["default/bs4/ends", "default/bs8/ends"]
    assert v.message == "policy met (identical): 2 condition(s) agree with the reference"


def test_token_flip_violates_identical_and_names_branch_tokens():
    v = judge(sweep(bs8=(A, B)))
    assert not v.passed
    bs8 = by_condition(v)["default/bs8/ends"]
    assert bs8.first_token_divergence == 5
    assert bs8.message == ("first token divergence at step 5 (run 4, row 7, 1 of 2 runs): "
                           "reference ' Queens' (margin 0.25) vs ' New' (margin 0.25)")
    assert by_condition(v)["default/bs4/ends"].passed
    assert v.message.startswith("policy violated (identical): 1 of 2 condition(s) fail; default/bs8/ends: first")


def test_logprob_bits_alone_violate_identical():
    bits = [LP, LP, LP - 2**-20, LP, LP, LP]
    v = judge(sweep(bs4_logprobs=bits))
    bs4 = by_condition(v)["default/bs4/ends"]
    assert not bs4.passed and bs4.first_token_divergence is None
    assert bs4.message.startswith("same tokens, but logprob bits differ from step 2 (run 1, row 0) at ' was'")
    assert "-0.5 vs -0.5000009536743164" in bs4.message


def test_message_from_summary_alone_uses_branch_tree_pieces():
    v = judge(sweep(bs8=(A, B)), with_streams=False)
    assert "reference ' Queens' vs ' New'" in by_condition(v)["default/bs8/ends"].message


def test_max_distinct_counts_the_reference():
    streams = sweep(bs4=(A, B), bs8=(A, C))  # 3 distinct: A (reference), B, C
    assert judge(streams, Policy("max-distinct", 3)).passed
    v = judge(streams, Policy.parse("max-distinct = 2"))
    assert not v.passed and len(v.failures) == 1  # the condition that brought the 3rd completion
    assert v.failures[0].message.startswith("3 distinct completions in default kernels, at most 2 allowed; "
                                            "first token divergence at step")
    assert not judge(streams, Policy("max-distinct", 1)).passed


def test_min_divergence_step():
    streams = sweep(bs8=(A, B))  # flips at step 5
    assert judge(streams, Policy("min-divergence-step", 5)).passed
    v = judge(streams, Policy.parse("min-divergence-step=6"))
    assert v.failures[0].message.startswith("diverges before step 6: first token divergence at step 5")


def test_max_logprob_diff():
    near = [LP, LP, LP - 1e-4, LP, LP, LP]
    assert judge(sweep(bs4_logprobs=near), Policy("max-logprob-diff", 1e-3)).passed
    far = [LP, LP, LP - 0.25, LP - 0.5, LP, LP]
    v = judge(sweep(bs4_logprobs=far), Policy.parse("max-logprob-diff = 0.1"))
    assert v.failures[0].message == ("logprob differs by 0.5 > 0.1 at step 3 "
                                     "(first over the limit at step 2; run 1, row 0)")
    assert not judge(sweep(bs8=(A, B)), Policy("max-logprob-diff", 10.0)).passed  # other tokens fail it


def test_max_logprob_diff_needs_streams():
    with pytest.raises(UsageError, match=r"max-logprob-diff needs logprobs: pass the streams \(streams.jsonl\)$"):
        judge(sweep(), Policy("max-logprob-diff", 0.1), with_streams=False)


def test_a_server_without_logprobs_is_judged_on_tokens_and_says_so():
    streams = sweep()
    summary = {**summary_of(streams), "load": {"mode": "server", "compare_level": "text"}}
    v = evaluate(summary, streams, Policy())
    assert v.passed and v.message == ("policy met (identical; compared at level text: logprob bits not checked): "
                                      "2 condition(s) agree with the reference")
    with pytest.raises(UsageError, match=r"the server sent none \(compared at level text\)$"):
        evaluate(summary, streams, Policy("max-logprob-diff", 0.1))


def test_every_kernels_mode_is_judged():
    streams = sweep(bs8=(A, B)) + [dict(s, run_id=s["run_id"] + 5, kernels="batch-invariant",
                                        condition_id=s["condition_id"].replace("default", "batch-invariant"))
                                   for s in sweep()]
    v = judge(streams)
    assert [(c.condition_id, c.passed) for c in v.conditions] == [
        ("default/bs4/ends", True), ("default/bs8/ends", False),
        ("batch-invariant/bs4/ends", True), ("batch-invariant/bs8/ends", True)]


@pytest.mark.parametrize("text, message", [
    ("exact", "requirement must be one of identical, max-distinct, min-divergence-step, max-logprob-diff, "
              "max-flip-rate, not 'exact'"),
    ("max-distinct", "requirement 'max-distinct' needs a value, as in 'max-distinct = N'"),
    ("max-distinct = 0", "max-distinct must be >= 1, not 0"),
    ("max-distinct = 1.5", "max-distinct must be an integer, not 1.5"),
    ("min-divergence-step = -1", "min-divergence-step must be >= 1, not -1"),
    ("min-divergence-step = 0", "min-divergence-step must be >= 1, not 0"),  # no divergence is before step 0
    ("max-flip-rate = 1", "max-flip-rate is a rate in (0, 1), not 1"),  # every run flipping would still pass
    ("max-logprob-diff = a lot", "requirement 'max-logprob-diff = a lot': 'a lot' is not a number"),
    ("identical = 1", "requirement 'identical' takes no value"),
])
def test_bad_requirements_are_one_line_usage_errors(text, message):
    with pytest.raises(UsageError) as err:
        Policy.parse(text)
    assert str(err.value) == message


def test_describe_round_trips():
    for text in ("identical", "max-distinct = 2", "min-divergence-step = 50", "max-logprob-diff = 0.001"):
        assert Policy.parse(text).describe() == text


def test_ci_modules_import_no_torch():
    import subprocess
    import sys

    code = ("import sys\nimport nondet.gate, nondet.gate.policy, nondet.gate.config, nondet.gate.junit, "
            "nondet.gate.github, nondet.gate.run, nondet.gate.diagnose\n"
            "print([m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def _two_prompts(second_prompt_tokens):
    """Every row a target: prompts 0 and 1 each alone (their references), then together in bs2/rows."""
    from gate_fixtures import stream

    def tagged(s, pid):
        return {**s, "prompt_id": pid}

    return [tagged(stream(0, "bs1/prompt-0", A, ref=True), 0), tagged(stream(1, "bs1/prompt-1", C, ref=True), 1),
            tagged(stream(2, "bs2/rows", A, position=0), 0),
            tagged(stream(3, "bs2/rows", second_prompt_tokens, position=1), 1)]


def test_several_prompts_in_one_batch_are_each_judged_against_their_own_reference():
    from nondet.probes.core.summarize import summarize_modes

    # prompt 1's reference is C; A would be a completion beyond it only for prompt 1
    same = _two_prompts(C)
    summary = summarize_modes(same, prompts=("first", "second"))
    v = evaluate(summary, same, Policy())
    assert v.passed and [c.condition_id for c in v.conditions] == ["default/bs2/rows"]
    assert evaluate(summary, same, Policy("max-distinct", 1)).passed
    flipped = _two_prompts(B)  # prompt 1 flips at step 3 (C has the hostile piece there, B ' born')
    summary = summarize_modes(flipped, prompts=("first", "second"))
    for policy in (Policy(), Policy("max-distinct", 1), Policy("min-divergence-step", 4)):
        bs2 = by_condition(evaluate(summary, flipped, policy))["default/bs2/rows"]
        assert not bs2.passed, policy
        assert "prompt 1 ('second')" in bs2.message and "at step 3 (run 3, row 1" in bs2.message, bs2.message
    # 2 runs per prompt (the reference and one row) cannot give 3 completions: max-distinct = 2 could not fail
    vacuous = evaluate(summary, flipped, Policy("max-distinct", 2))
    assert not vacuous.passed and [c.condition_id for c in vacuous.failures] == ["max-distinct"]
    assert vacuous.failures[0].message.startswith("max-distinct = 2 cannot fail here: default kernels ran at most "
                                                  "2 run(s) per prompt")
