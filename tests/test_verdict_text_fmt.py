"""One verdict builder, one text-visibility function, one set of formatters."""

import math

import pandas as pd

from nondet.fmt import fmt_float, fmt_hex, fmt_hex_value, fmt_step, is_missing
from nondet.text import quoted, visible
from nondet.verdict import report_verdict, verdict


def _mode(distinct=1, ftd=None, fnd=None, **extra) -> dict:
    return {"distinct_completions": distinct, "n_runs": 9, "n_conditions": 3, "first_token_divergence": ftd,
            "first_numeric_divergence": fnd, **extra}


def test_summary_sentence_per_mode():
    modes = {"default": _mode(3, 5, 2), "batch-invariant": _mode()}
    assert verdict(modes) == ("default kernels: batch-variant, 3 distinct completions over 9 runs; first token "
                              "divergence at step 5; batch-invariant kernels: batch-invariant, 1 distinct "
                              "completion over 9 runs, bit-identical logprobs")
    assert verdict({"default": _mode(fnd=4)}) == ("default kernels: same tokens over 9 runs, but logprob bits "
                                                  "differ from step 4")


def test_server_without_logprobs_compares_texts():
    assert verdict({"default": _mode(2, 7)}, level="words") == (
        "server: batch-variant, 2 distinct completions over 9 runs; first divergence at word 7")
    assert verdict({"default": _mode()}, level="tokenizer") == (
        "server: 1 distinct completion over 9 runs (texts compared token by token)")


def test_report_headline():
    modes = {"default": _mode(2, 5, 1), "batch-invariant": _mode()}
    assert report_verdict(modes, "default", ["matmul"]) == (
        "Batch-variant: 2 distinct completions over 3 conditions (9 runs); first token divergence at step 5; "
        "fixed by batch-invariant matmul; with batch-invariant kernels: 1 completion, bit-identical logprobs.")
    na = {"default": _mode(numeric_na="server returned no logprobs")}
    assert report_verdict(na, "default") == ("No token divergence: 1 completion over 3 conditions; logprob bits "
                                             "n/a (server returned no logprobs).")


def test_terminal_and_report_escape_alike():
    text = "a\nb\x00\u202e\ufffd\udcff"
    assert visible(text) == "a\\nb\\u0000\\u202e\\ufffd\\xff"
    assert quoted(text) == f"'{visible(text)}'"
    assert quoted("it's") == "\"it's\""


def test_formatters_treat_every_missing_value_alike():
    for missing in (None, math.nan, pd.NA):
        assert is_missing(missing)
        assert fmt_step(missing) == "—" and fmt_step(missing, missing="-") == "-"
        assert fmt_float(missing) == "—"
    assert not is_missing(0) and fmt_step(0) == "0" and fmt_float(0.123456) == "0.123"
    assert fmt_hex("0x1.8000000000000p-3") == "0.188 (0x1.8p-3)"
    assert fmt_hex_value("0x1.8000000000000p-3") == "0.1875" and fmt_hex_value(None) == "?"


def test_a_server_verdict_speaks_of_the_server_not_of_our_kernels():
    from nondet.verdict import verdict

    m = {"distinct_completions": 1, "n_runs": 8, "first_numeric_divergence": 3, "first_token_divergence": None}
    assert verdict({"default": m}, subject="server") == (
        "server: same tokens over 8 runs, but logprob bits differ from step 3")
    assert verdict({"default": m}).startswith("default kernels: same tokens over 8 runs")
