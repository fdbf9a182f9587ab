"""summary.json's speculative section: the speedup split into tokens per round and the round's cost."""

from nondet.probes.speculative.summary import speculative_section


def _stream(kernels, reference, tokens, seconds, drafted=None, accepted=None):
    steps = [{"token": t, "logprob": "0x0p+0"} for t in tokens]
    stream = {"kernels": kernels, "prompt_id": 0, "is_reference": reference, "run_id": f"{kernels}-{reference}",
              "condition_id": f"{kernels}/{'ref' if reference else 'spec'}", "steps": steps, "seconds": seconds,
              "tokens_per_s": len(tokens) / seconds}
    if not reference:
        stream.update(speculative="draft:4", drafted=drafted, accepted=accepted,
                      acceptance_rate=sum(accepted) / sum(drafted) if drafted else None)
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
