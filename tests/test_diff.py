"""Diff and branch-tree logic on synthetic streams."""

from nondet.probes.core.diff import branch_tree, first_numeric_divergence, first_token_divergence, summarize


def stream(run_id, tokens, logprobs=None, ref=False, cond="c", margins=None):
    logprobs = logprobs or [float(-0.5).hex()] * len(tokens)
    margins = margins or [float(0.25).hex()] * len(tokens)
    steps = [{"token": t, "logprob": lp, "margin": m, "piece": f"<{t}>"}
             for t, lp, m in zip(tokens, logprobs, margins)]
    return {"run_id": run_id, "condition_id": cond, "position": 0, "is_reference": ref,
            "kernels": "default", "steps": steps}


def test_identical_streams_have_one_completion_and_no_divergence():
    s = [stream(0, [1, 2, 3], ref=True), stream(1, [1, 2, 3]), stream(2, [1, 2, 3])]
    m = summarize(s)
    assert m["distinct_completions"] == 1
    assert m["most_common_count"] == 3
    assert m["first_token_divergence"] is None and m["first_numeric_divergence"] is None
    assert m["branch_tree"] is None


def test_numeric_divergence_precedes_token_flip():
    ref = stream(0, [1, 2, 3, 4], ref=True)
    bits = [float(-0.5).hex(), float(-0.5000001).hex(), float(-0.5).hex(), float(-0.5).hex()]
    run = stream(1, [1, 2, 9, 4], logprobs=bits)
    assert first_numeric_divergence(ref, run) == 1
    assert first_token_divergence(ref, run) == 2


def test_divergence_at_step_zero():
    ref, run = stream(0, [5, 6], ref=True), stream(1, [7, 6])
    assert first_token_divergence(ref, run) == 0
    assert first_numeric_divergence(ref, run) == 0


def test_shorter_stream_diverges_where_it_ends():
    ref, run = stream(0, [1, 2, 3], ref=True), stream(1, [1, 2])
    assert first_token_divergence(ref, run) == 2


def test_branch_tree_counts_and_nesting():
    # 5 runs: 3 follow the reference, 2 branch at step 2; of those, 1 branches again at step 4.
    s = [stream(0, [1, 2, 3, 4, 5], ref=True), stream(1, [1, 2, 3, 4, 5]), stream(2, [1, 2, 3, 4, 5]),
         stream(3, [1, 2, 8, 4, 5]), stream(4, [1, 2, 8, 4, 6])]
    tree = branch_tree(s, lambda ids: "".join(f"<{i}>" for i in ids))
    assert tree["step"] == 2 and tree["count"] == 5
    assert tree["prefix_text"] == "<1><2>"
    main, alt = tree["alternatives"]
    assert (main["token"], main["count"], main["is_reference"]) == (3, 3, True)
    assert main["child"] is None
    assert (alt["token"], alt["count"], alt["is_reference"]) == (8, 2, False)
    assert alt["child"]["step"] == 4
    assert sorted(a["count"] for a in alt["child"]["alternatives"]) == [1, 1]
    m = summarize(s)
    assert m["distinct_completions"] == 3 and m["most_common_count"] == 3
    assert m["completions"][0]["is_reference"] and m["completions"][0]["count"] == 3


def test_sampling_streams_group_by_tokens_not_by_condition():
    # Sampled runs with their own seeds: same tokens from different conditions are one completion.
    s = [stream(0, [4, 4, 1], ref=True, cond="a"), stream(1, [4, 4, 1], cond="b"), stream(2, [4, 2, 1], cond="b")]
    m = summarize(s)
    assert m["distinct_completions"] == 2
    by_cond = {c["condition_id"]: c for c in m["conditions"]}
    assert by_cond["b"]["distinct_completions"] == 2 and by_cond["b"]["first_token_divergence"] == 1


def test_a_whole_completion_is_shown_as_its_streams_text_where_pieces_cannot_spell_it():
    """A server's pieces may be `token_id:N` (vLLM --return-tokens-as-token-ids) or half a UTF-8 character: a
    completion's text is the text its stream recorded, not its pieces joined. Control: a stream without a text
    still joins its pieces, and a given decoder wins."""
    ref, other = stream(0, [1, 2, 3], ref=True), stream(1, [1, 2, 4])
    ref["text"] = " a b c"
    texts = {c["tokens"][-1]: c["text"] for c in summarize([ref, other])["completions"]}
    assert texts == {3: " a b c", 4: "<1><2><4>"}
    decoded = summarize([ref, other], decode=lambda tokens: "|".join(map(str, tokens)))["completions"]
    assert sorted(c["text"] for c in decoded) == ["1|2|3", "1|2|4"]
