"""verdict.tp_verdict: a --tp probe's sentence words the batch variance within each degree apart from what
changing the degree does (the run's main diff mixes the two). Pure Python over summary.json sections."""

from nondet.verdict import tp_verdict


def _degree(tp: int, distinct: int = 1, token=None, numeric=None) -> dict:
    return {"tp": tp, "n_runs": 5, "distinct_completions": distinct, "first_token_divergence": token,
            "first_numeric_divergence": numeric}


def _against(tp: int, token=None, numeric=None) -> dict:
    return {"tp": tp, "against": 1, "first_token_divergence": token, "first_numeric_divergence": numeric,
            "bitwise_equal": numeric is None}


def _section(by_degree, vs_reference, tp_invariant=False, mode="batch-invariant") -> dict:
    return {"degrees": [1, 2], "reference_degree": 1, "tp_invariant": tp_invariant,
            "modes": {mode: {"by_degree": by_degree, "vs_reference": vs_reference}}}


def test_invariant_at_every_degree_reads_so_when_the_degrees_differ():
    sentence = tp_verdict(_section([_degree(1), _degree(2)], [_against(2, numeric=5)]))
    assert sentence.startswith("batch-invariant kernels: batch-invariant at every TP degree (TP1, TP2:"), sentence
    assert "TP2 against TP1: same tokens, logprob bits differ from step 5" in sentence
    assert "--tp-invariant makes them agree" in sentence  # how to make the degrees agree (under the mode)
    assert "bits differ from step 5" not in sentence.split(";")[0]  # the degree change is not called batch variance


def test_variance_within_a_degree_is_named_at_that_degree():
    # the control: the same section with TP2's batches varying must not read as invariant
    sentence = tp_verdict(_section([_degree(1), _degree(2, distinct=3, token=7, numeric=2)],
                                   [_against(2, numeric=5)], mode="default"))
    assert "batch-invariant at every TP degree" not in sentence
    assert sentence.startswith("default kernels at TP1: batch-invariant, 1 distinct completion over 5 runs, "
                               "bit-identical logprobs; at TP2: batch-variant, 3 distinct completions over 5 runs; "
                               "first token divergence at step 7; TP2 against TP1:"), sentence
    assert sentence.endswith("TP2 against TP1: same tokens, logprob bits differ from step 5 (the degrees sum in "
                             "different orders)")  # --tp-invariant takes the mode: not offered for the default
    bits = tp_verdict(_section([_degree(1, numeric=1), _degree(2)], [], mode="default"))
    assert bits.startswith("default kernels at TP1: same tokens over 5 runs, but logprob bits differ from step 1; "
                           "at TP2: batch-invariant"), bits


def test_tp_invariant_degrees_that_agree_or_not():
    equal = tp_verdict(_section([_degree(1), _degree(2)], [_against(2)], tp_invariant=True))
    assert equal.endswith("TP2 against TP1: bit-identical")
    differ = tp_verdict(_section([_degree(1), _degree(2)], [_against(2, token=9, numeric=3)], tp_invariant=True))
    assert differ.endswith("TP2 against TP1: tokens differ from step 9")  # no excuse: the tree should have held
