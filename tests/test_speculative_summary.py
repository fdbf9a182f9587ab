"""summary.json's speculative section: the speedup split into tokens per round and the round's cost."""

from types import SimpleNamespace

from nondet.probes.speculative.summary import speculative_section
from nondet.reports.speculative import speculative_sections


def _stream(kernels, reference, tokens, seconds, drafted=None, accepted=None):
    steps = [{"token": t, "logprob": "0x0p+0"} for t in tokens]
    stream = {"kernels": kernels, "prompt_id": 0, "is_reference": reference, "run_id": f"{kernels}-{reference}",
              "condition_id": f"{kernels}/{'ref' if reference else 'spec'}", "steps": steps, "seconds": seconds,
              "tokens_per_s": len(tokens) / seconds}
    if not reference:
        stream.update(speculative="draft:4", drafted=drafted, accepted=accepted,
                      acceptance_rate=sum(accepted) / sum(drafted) if drafted and sum(drafted) else None)
    return stream


def test_speedup_is_tokens_per_round_over_round_cost():
    tokens = list(range(12))
    streams = [
        _stream("default", True, tokens, 1.2),  # plain: 0.1 s a token
        _stream("default", False, tokens, 0.6, drafted=[4, 4, 4], accepted=[4, 3, 2]),  # 3 rounds of 0.2 s
        _stream("batch-invariant", True, tokens, 2.4),  # plain: 0.2 s a token
        _stream("batch-invariant", False, tokens, 2.4, drafted=[4] * 6, accepted=[1] * 6),  # 6 rounds of 0.4 s
    ]
    rows = {r["kernels"]: r for r in speculative_section(streams, ["draft:4"])["by_form"]}
    assert rows["default"]["rounds"] == 3 and rows["default"]["tokens_per_round"] == 4.0
    assert rows["default"]["round_cost"] == 2.0  # 0.2 s / 0.1 s
    assert rows["default"]["speedup"] == 2.0 == rows["default"]["tokens_per_round"] / rows["default"]["round_cost"]
    assert rows["batch-invariant"]["tokens_per_round"] == 2.0 and rows["batch-invariant"]["round_cost"] == 2.0
    assert rows["batch-invariant"]["speedup"] == 1.0  # half the default's: acceptance, not the round's cost


def test_no_rounds_no_round_cost():
    streams = [_stream("default", True, [1, 2], 1.0), _stream("default", False, [1, 2], 1.0, drafted=[], accepted=[])]
    row = speculative_section(streams, ["draft:4"])["by_form"][0]
    assert row["rounds"] == 0 and row["tokens_per_round"] is None and row["round_cost"] is None


def test_a_form_that_drafted_nothing_has_no_gain_and_says_so():
    from rich.console import Console

    from nondet.cli.render_speculative import print_speculative
    from nondet.verdict import undrafted_line

    tokens = list(range(4))
    plain = _stream("default", True, tokens, 1.0)
    undrafted = _stream("default", False, tokens, 0.5, drafted=[0] * 4, accepted=[0] * 4)  # faster by noise alone
    section = speculative_section([plain, undrafted], ["draft:4"])
    form = section["by_form"][0]
    assert form["drafted"] == 0 and form["speedup"] is None and section["conditions"][0]["speedup"] is None
    console = Console(record=True, width=200)
    print_speculative({"speculative": section}, console)
    assert "draft:4 (default kernels) drafted no token in 4 round(s)" in console.export_text()
    report = speculative_sections(SimpleNamespace(summary={"speculative": section}))[0]
    assert any("drafted no token" in str(block.parts) for block in report.blocks if hasattr(block, "parts"))
    # The control: the same timings with drafts give a gain and no such line.
    drafted = _stream("default", False, tokens, 0.5, drafted=[2] * 2, accepted=[1] * 2)
    form = speculative_section([plain, drafted], ["draft:4"])["by_form"][0]
    assert form["speedup"] == 2.0 and undrafted_line(form) is None
