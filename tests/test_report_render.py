"""report.md and report.html from synthetic run directories: structure, numbers, escaping, hints."""

import json
import re
from pathlib import Path
from xml.etree import ElementTree

import pytest
from report_fixtures import write_run

from nondet.reports import write_report

HEADINGS = ["# nondet probe: nondet-embedded-qwen3 (run)", "## Verdict", "## Prompts", "## Conditions", "## Branch tree", "## Token diff",
            "## Figures", "### First divergence steps", "### Completions by batch size",
            "### Bisect: where the difference is born", "### Bisect: amplification",
            "### Before / after: batch-invariant kernels", "## Ablation", "## Environment", "## Reproduce"]
VERDICT = ("**Batch-variant: 3 distinct completions over 5 conditions (8 runs); first token divergence at step 5"
           "; fixed by batch-invariant matmul; with batch-invariant kernels: 1 completion, bit-identical logprobs.**")


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> tuple[Path, str, str]:
    run = write_run(tmp_path_factory.mktemp("full") / "run", bisect=True, confirm=True)
    md, html = write_report(run)
    return run, md.read_text(), html.read_text()


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> tuple[Path, str, str]:
    run = write_run(tmp_path_factory.mktemp("bare") / "run")
    md, html = write_report(run)
    return run, md.read_text(), html.read_text()


def _headings(md: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith("#")]


def test_write_report_returns_paths_in_the_run_dir(full):
    run, _, _ = full
    assert (run / "report.md").is_file() and (run / "report.html").is_file()
    assert sorted(p.name for p in (run / "figures").iterdir()) == [
        "amplification.svg", "bisect_heatmap.svg", "distinct_by_batch_size.svg", "first_divergence.svg",
        "kernels_before_after.svg"]


def test_each_figure_is_well_formed_svg(full):
    run = full[0]
    for path in sorted((run / "figures").iterdir()):
        root = ElementTree.fromstring(path.read_bytes())
        assert root.tag == "{http://www.w3.org/2000/svg}svg", path.name
        assert root.get("font-family") == "sans-serif" and float(root.get("width")) >= 600
        assert len(root.findall(".//{http://www.w3.org/2000/svg}text")) >= 5, path.name  # ticks, labels, title


def test_figure_labels_are_escaped_in_the_svg(tmp_path):
    """A module's op class is model-derived: `<script>` and `&` in it stay text in the heatmap's SVG."""
    from nondet.reports.figures import bisect_heatmap
    from nondet.reports.tables import read_tables

    run = write_run(tmp_path / "run", bisect=True)
    t = read_tables(run)
    t.bisect_modules.loc[t.bisect_modules.op_class == "norm", "op_class"] = "<script>x</script> & co"
    svg = bisect_heatmap(t).decode("utf-8")
    assert "<script" not in svg
    assert "&lt;script&gt;x&lt;/script&gt; &amp; co" in svg
    texts = [e.text for e in ElementTree.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert "<script>x</script> & co" in texts


def test_markdown_headings_in_order(full, bare):
    assert _headings(full[1]) == HEADINGS
    assert _headings(bare[1]) == HEADINGS  # absent data keeps its heading and says how to get it


def test_markdown_verdict_and_model_note(full):
    md = full[1]
    assert VERDICT in md
    assert "the embedded demonstration model (`nondet-embedded-qwen3`" in md


def test_markdown_conditions_table(full):
    md = full[1]
    assert ("| condition | kernels | load | batch size | positions | fillers | runs | runs ≠ reference "
            "| distinct completions | first token divergence | first numeric divergence |") in md
    assert "| `default/bs4/ends` | default | static | 4 | 0, 3 | same-length | 2 | 1 | 2 | 5 | 1 |" in md
    assert "| `default/bs8/ends` | default | static | 8 | 0, 7 | same-length | 2 | 2 | 2 | 5 | 1 |" in md
    assert "| `default/bs1` | default | static | 1 | 0 | none | 1 | 0 | 1 | — | — |" in md
    assert ("| `batch-invariant/bs8/ends` | batch-invariant | static | 8 | 0, 7 | same-length "
            "| 2 | 0 | 1 | — | — |") in md


def test_markdown_branch_tree(full):
    md = full[1]
    assert "- step 5, 8 runs, after `Richard Feynman was born in`" in md
    assert ("  - `  Queens ` × 6 (75%, reference), margin 0.00781 (0x1p-7), "
            "then `, New York. He studied at MIT`") in md
    assert "    - step 8, 6 runs, after `Richard Feynman was born in Queens, New`" in md
    assert "  - `  New ` × 2 (25%), margin 0.00781 (0x1p-7)" in md


def test_markdown_token_diff(full):
    md = full[1]
    assert "**Completion 1**: 2 of 8 runs, e.g. run 4 (`default/bs4/ends`, position 3); splits at step 5" in md
    assert "| reference | `Richard Feynman was born in` | **`  Queens `** | `, New York. He studied at MIT` |" in md
    assert "that token ranked #2 of its top 5" in md
    assert "| completion 2 | `Richard Feynman was born in Queens, New` | **`<script>alert(1)</script>`** " in md


def test_markdown_bisect_ablation_reproduce(full):
    run, md, _ = full
    assert "born at **step 1** in `model.layers.0.self_attn.q_proj` (op class matmul, layer 0)." in md
    assert ("The token flips at step 5, where the reference's top1−top2 margin was 0.00781 (0x1p-7): "
            "the reference took `  Queens `, the divergent run `  New `.") in md
    assert "![Heatmap of differences by layer and op class](figures/bisect_heatmap.svg)" in md
    assert "| 0 | `model.layers.0.self_attn.q_proj` | matmul | 0.00112 | 0.00449 | 73 | 17 |" in md
    assert "| `matmul` | yes | yes | — | — | — |" in md
    assert "| `norm` | no | no | 5 | 1 | step 1: model.layers.0.self_attn.q_proj (matmul) |" in md
    assert "Minimal set that removes the divergence: **matmul**." in md
    assert "| `model.layers` | 4 |" in md
    assert "nondet probe --batch-sizes 1,2,4,8 --runs 7 --max-new-tokens 14 --confirm\n" in md
    assert f"nondet bisect {run} --condition default/bs8/ends\n" in md


def test_markdown_escapes_model_text(full):
    md = full[1]
    assert "`\\xff\\ufffd\\u0000. He`" in md
    for line in md.splitlines():  # raw model HTML only ever inside code spans
        assert "<script>" not in re.sub(r"(`+).*?\1", "", line)


def test_absent_sections_are_one_line_hints(bare):
    run, md, html = bare
    assert f"No bisect yet: run `nondet bisect {run}`." in md
    assert f"No ablation yet: run `nondet bisect {run}`" in md
    assert ("No before/after comparison yet: run "
            "`nondet probe --batch-sizes 1,2,4,8 --runs 7 --max-new-tokens 14 --confirm`.") in md
    assert "bisect_heatmap" not in md and "## Ablation\n\nNo ablation yet" in md
    assert f'<p class="hint">No bisect yet: run <code>nondet bisect {run}</code>.</p>' in html
    assert "first token divergence at step 5." in md  # no fix claimed without ablation or confirm


def test_html_is_self_contained(full):
    html = full[2]
    assert html.startswith("<!DOCTYPE html>")
    assert "default-src 'none'" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert html.count('src="data:image/svg+xml;base64,') == 5
    assert "@media print" in html


def test_html_escapes_script_and_invalid_bytes(full):
    html = full[2]
    assert "<script" not in html.lower()  # neither model text nor the page itself runs scripts
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert '<span class="esc">\\xff</span><span class="esc">\\ufffd</span><span class="esc">\\u0000</span>' in html
    assert "\ufffd" not in html and "\x00" not in html
    html.encode("utf-8")  # no lone surrogates made it through


def test_html_carries_the_same_numbers(full):
    html = full[2]
    assert VERDICT.strip("*") in html
    assert ("<tr><td><code>default/bs4/ends</code></td><td>default</td><td>static</td><td>4</td><td>0, 3</td>"
            "<td>same-length</td><td class=num>2</td><td class=num>1</td><td class=num>2</td><td class=num>5</td>"
            "<td class=num>1</td></tr>"
            ) in html
    assert '<span class="count">× 6</span>' in html


def test_invariant_run_verdict(tmp_path):
    from nondet.rundir import RunDir

    run = write_run(tmp_path / "run", confirm=True)
    rd = RunDir(run)
    summary = rd.read_json("summary.json")
    del summary["modes"]["default"]
    rd.write_json("summary.json", summary)
    md = write_report(run)[0].read_text()
    assert ("**Batch-invariant with batch-invariant kernels: 1 completion over 5 conditions, "
            "bit-identical logprobs.**") in md
    assert "No branch point: every run produced the reference completion." in md
    assert "No divergent completion: every run matches the reference token for token." in md


def test_sparse_server_run_renders(tmp_path):
    """A live-server run: no batch size or positions, steps without logprobs, top-k or margin."""
    from nondet.rundir import RunDir

    rd = RunDir(tmp_path / "run")
    rd.append_jsonl("conditions.jsonl", {"condition_id": "default/server", "kernels": "default", "load": "server",
                                         "batch_size": None, "positions": None, "fillers": "same-length",
                                         "label": "server"})
    texts = [["A", " b", " c"], ["A", " b", " c"], ["A", " x", "\udcfe"]]
    for i, pieces in enumerate(texts):
        rd.append_jsonl("streams.jsonl", {"run_id": i, "condition_id": "default/server", "kernels": "default",
                                          "position": i, "is_reference": i == 0, "text": "".join(pieces),
                                          "steps": [{"token": ord(p[-1]), "piece": p} for p in pieces]})
    rd.write_json("summary.json", {"modes": {"default": {
        "kernels": "default", "reference_run_id": 0, "n_runs": 3, "n_conditions": 1, "distinct_completions": 2,
        "most_common_count": 2, "first_token_divergence": 1, "first_numeric_divergence": None,
        "runs": [{"run_id": i, "condition_id": "default/server", "position": i, "completion_id": int(i == 2),
                  "first_token_divergence": 1 if i == 2 else None, "first_numeric_divergence": None}
                 for i in range(3)],
        "conditions": [{"condition_id": "default/server", "n_runs": 3, "distinct_completions": 2,
                        "first_token_divergence": 1, "first_numeric_divergence": None}],
        "completions": [{"completion_id": 0, "count": 2, "is_reference": True, "text": "A b c", "tokens": []},
                        {"completion_id": 1, "count": 1, "is_reference": False, "text": "A x", "tokens": []}],
        "branch_tree": {"step": 1, "count": 3, "prefix_text": "A", "alternatives": [
            {"token": 98, "piece": " b", "count": 2, "margin": None, "is_reference": True, "child": None},
            {"token": 120, "piece": " x", "count": 1, "margin": None, "is_reference": False, "child": None}]}}},
        "verdict": "..."})
    md, html = (p.read_text() for p in write_report(rd.path))
    assert "| `default/server` | default | server | — | — | same-length | 3 | 1 | 2 | 1 | — |" in md
    assert "No environment fingerprint (fingerprint.json is missing)" in md
    assert "No recorded command (config.json is missing or has no argv)." in md
    assert "| completion 1 | `A` | **`  x `** | `\\xfe` |" in md
    assert '<span class="esc">\\xfe</span>' in html


def test_odd_characters_become_visible_escapes():
    from nondet.reports.text import html_text, md_code, visible

    assert visible("a\nb\tc\x00\x7f\u202e\u200b\ufffd\udcff\ud800é") == \
        "a\\nb\\tc\\u0000\\u007f\\u202e\\u200b\\ufffd\\xff\\ud800é"
    assert html_text("<b>&\"'\udc80") == '&lt;b&gt;&amp;&quot;&#x27;<span class="esc">\\x80</span>'
    assert md_code("a`b") == "``a`b``" and md_code("`x") == "`` `x ``" and md_code("|", in_table=True) == "`\\|`"


def test_short_hex_keeps_the_value():
    from nondet.fmt import short_hex

    for h in ("0x1.0000000000000p-7", "-0x1.6900080000000p+2", "0x0.0p+0", "inf"):
        assert float.fromhex(short_hex(h)) == float.fromhex(h)
    assert short_hex("0x1.8000000000000p-3") == "0x1.8p-3"


def test_the_decode_path_is_named_per_kernels_mode(tmp_path):
    run = write_run(tmp_path / "run", confirm=True)
    env = json.loads((run / "fingerprint.json").read_text())
    (run / "fingerprint.json").write_text(json.dumps({**env, "decode_path": "torch.compile (inductor, CUDA graphs), "
                                                                            "static KV cache"}))
    summary = json.loads((run / "summary.json").read_text())
    summary["decode_path"] = {"compiled": "torch.compile (inductor, CUDA graphs), static KV cache", "modes": {
        "default": {"path": "compiled", "reason": None, "warmup_s": 41.0, "measured_s": 3.2, "conditions": 5},
        "batch-invariant": {"path": "eager", "reason": "InductorError: <boom>", "warmup_s": 2.0,
                            "measured_s": 9.5, "conditions": 5}}}
    (run / "summary.json").write_text(json.dumps(summary))
    md, html = (p.read_text() for p in write_report(run))
    assert ("Decode path: torch.compile (inductor, CUDA graphs), static KV cache; default kernels compiled (compile "
            "+ warm-up 41.0 s, decoding 3.2 s); batch-invariant kernels eager (could not compile: InductorError: "
            "&lt;boom&gt;; decoding 9.5 s).") in md
    assert "&lt;boom&gt;" in html and "<boom>" not in html


def test_an_eager_run_names_its_path(tmp_path):
    run = write_run(tmp_path / "run")
    env = json.loads((run / "fingerprint.json").read_text())
    (run / "fingerprint.json").write_text(json.dumps({**env, "decode_path": "eager, dynamic KV cache"}))
    md, _ = write_report(run)
    assert "Decode path: eager, dynamic KV cache." in md.read_text()
    bare = write_run(tmp_path / "bare")
    assert "Decode path" not in write_report(bare)[0].read_text()  # an old run directory: nothing claimed


def test_a_chat_prompt_is_one_row_per_turn_escaped(tmp_path):
    run = write_run(tmp_path / "run")
    header = json.loads((run / "config.json").read_text())
    messages = [{"role": "system", "content": "Be <b>brief</b>."}, {"role": "user", "content": "Line one\nline | two"}]
    header["config"].update(prompts=[{"messages": messages}, "plain <i>text</i>"], chat=False)
    (run / "config.json").write_text(json.dumps(header))
    md, html = (path.read_text() for path in write_report(run))
    assert ("| prompt | role | text |\n| --- | --- | --- |\n| p0 | system | `Be <b>brief</b>.` |\n"
            "|  | user | `Line one\\nline \\| two` |\n| p1 | — | `plain <i>text</i>` |") in md
    assert "Be &lt;b&gt;brief&lt;/b&gt;." in html and "<b>brief" not in html
    assert "plain &lt;i&gt;text&lt;/i&gt;" in html


def test_plain_prompts_under_chat_show_the_turns_sent(tmp_path):
    run = write_run(tmp_path / "run")
    header = json.loads((run / "config.json").read_text())
    header["config"].update(prompt="Why?", chat=True, system="Be brief.")
    (run / "config.json").write_text(json.dumps(header))
    md = write_report(run)[0].read_text()
    assert "| p0 | system | `Be brief.` |\n|  | user | `Why?` |" in md


def test_model_note_names_the_trained_demo_and_its_injected_norm(tmp_path):
    run = write_run(tmp_path / "run")
    fp = json.loads((run / "fingerprint.json").read_text())
    fp["model"].update(name="SmolLM2-135M-Instruct", demo="trained",
                       injected_variance="model.layers.1.post_attention_layernorm")
    (run / "fingerprint.json").write_text(json.dumps(fp))
    md = write_report(run)[0].read_text()
    assert "Model: the demo model (`SmolLM2-135M-Instruct`, trained, " in md and "random weights" not in md
    assert "`model.layers.1.post_attention_layernorm` was made batch-variant on purpose" in md


def test_token_diff_compares_each_completion_with_its_own_prompts_reference():
    """Several prompts: a divergent completion of p1 is diffed against p1 alone, not against p0."""
    from types import SimpleNamespace

    import pandas as pd

    from nondet.reports.content import _token_diffs

    def rows(run_id, words):
        return [{"run_id": run_id, "step": i, "token": hash(w) % 1000, "piece": w, "logprob_hex": "-0x1p-1",
                 "margin_hex": "0x0p+0", "top_ids": []} for i, w in enumerate(words)]

    streams = pd.DataFrame(rows(0, ["Feynman", "was", "born"]) + rows(1, ["The", "sky", "is"])
                           + rows(2, ["The", "sky", "looks"]))
    mode = {"reference_run_id": 0,
            "prompts": [{"prompt_id": 0, "reference_run_id": 0}, {"prompt_id": 1, "reference_run_id": 1}],
            "completions": [{"completion_id": 0, "count": 1, "is_reference": True, "prompt_id": 0},
                            {"completion_id": 1, "count": 1, "is_reference": True, "prompt_id": 1},
                            {"completion_id": 2, "count": 1, "is_reference": False, "prompt_id": 1}],
            "runs": [{"run_id": 2, "completion_id": 2, "condition_id": "default/bs2/rows/0", "position": 1}]}
    t = SimpleNamespace(primary_mode="default", modes={"default": mode}, streams=streams)
    diff = _token_diffs(t)[1]
    assert diff.step == 2 and diff.before == ["The", "sky"] and diff.ref_after == ["is"]
    assert "1 of p1's 2 runs" in "".join(x for x in diff.title if isinstance(x, str))


def test_branch_tree_shows_each_prompt_that_split():
    """Several prompts: one tree per prompt that split, each following that prompt's own runs."""
    from types import SimpleNamespace

    import pandas as pd

    from nondet.reports.blocks import BranchPoint, Para
    from nondet.reports.content import _tree

    def rows(run_id, words):
        return [{"run_id": run_id, "step": i, "token": sum(map(ord, w)), "piece": w} for i, w in enumerate(words)]

    # p0's and p1's divergent runs both take "x" at step 1: each tree must continue with its own run.
    streams = pd.DataFrame(rows(0, ["a", "b", "p0ref"]) + rows(1, ["a", "x", "p0alt"])
                           + rows(2, ["c", "d", "p1ref"]) + rows(3, ["c", "x", "p1alt"]))

    def tree(ref_tok, alt_tok, prefix):
        return {"step": 1, "count": 2, "prefix_text": prefix, "alternatives": [
            {"token": ref_tok, "piece": "ref", "count": 1, "is_reference": True, "margin": None},
            {"token": alt_tok, "piece": "x", "count": 1, "margin": None}]}

    mode = {"branch_tree": tree(sum(map(ord, "b")), sum(map(ord, "x")), "a"),
            "prompts": [{"prompt_id": 0, "branch_tree": tree(sum(map(ord, "b")), sum(map(ord, "x")), "a")},
                        {"prompt_id": 1, "branch_tree": tree(sum(map(ord, "d")), sum(map(ord, "x")), "c")},
                        {"prompt_id": 2, "branch_tree": None}],
            "runs": [{"run_id": 0, "prompt_id": 0}, {"run_id": 1, "prompt_id": 0},
                     {"run_id": 2, "prompt_id": 1}, {"run_id": 3, "prompt_id": 1}]}
    parts = _tree(SimpleNamespace(primary_mode="default", modes={"default": mode}, streams=streams))
    labels = [p.parts[0] for p in parts if isinstance(p, Para) and p.kind == "p"]
    points = [p for p in parts if isinstance(p, BranchPoint)]
    assert labels == ["Prompt p0:", "Prompt p1:"]
    assert [p.prefix for p in points] == ["a", "c"]
    assert [a.continuation for a in points[0].alternatives] == ["p0ref", "p0alt"]
    assert [a.continuation for a in points[1].alternatives] == ["p1ref", "p1alt"]
