"""At 80 columns (a default terminal, or COLUMNS=80 in a log) every table shows its headers whole
and no line runs past the width: probe (one prompt, several), --confirm, bisect and compare. A
table that fits a wide terminal keeps its full headers there."""

import csv
import json
import os
from io import StringIO

import pytest
from rich.console import Console

from nondet.cli.render_bisect import MODULE_COLUMNS, NARROW_MODULE_COLUMNS, _modules_table, _table_steps
from nondet.cli.compare import fold
from nondet.cli.fit import natural_width
from nondet.cli.render import print_probe_summary
import cli_runner

PROMPTS = ["Why is the sky blue?", "Write a short poem about the moon."]  # the second one shortened
PROMPT_HEADERS = ["prompt", "text", "runs", "distinct", "token", "numeric"]
CONDITION_HEADERS = ["condition", "runs", "distinct", "token", "numeric"]
WIDE_DIVERGENCE = ["first token divergence", "first numeric divergence"]


def nondet(*args, columns: int | None = 80):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    r = cli_runner.run(args, env=env, timeout=600)
    assert r.returncode in (0, 1), r.stderr
    return r.stdout


def headers(out: str) -> list[list[str]]:
    """Each table's header cells, one list per table; a header rich cut or wrapped fails here."""
    rows = [line for line in out.splitlines() if line.startswith("┃")]
    return [[cell.strip() for cell in row.strip("┃").split("┃")] for row in rows]


def assert_fits(out: str, width: int = 80) -> None:
    wide = [line for line in out.splitlines() if len(line) > width]
    assert not wide, "\n".join(wide)
    assert "…" not in "".join(line for line in out.splitlines() if line.startswith("┃"))


def module_rows(run) -> list[dict]:
    """bisect_modules.csv typed as bisect's own rows (the CLI renders those)."""
    with open(run / "bisect_modules.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r.update(step=int(r["step"]), order=int(r["order"]), max_abs_diff=float(r["max_abs_diff"]),
                 max_rel_diff=float(r["max_rel_diff"]), differs=r["differs"] == "True")
    return rows


def rendered(summary: dict, width: int) -> str:
    buf = StringIO()
    print_probe_summary(summary, "RUN", Console(file=buf, width=width))
    return buf.getvalue()


@pytest.fixture(scope="module")
def confirm_run(tmp_path_factory, default_model_dir):
    """The default model, two prompts, default then batch-invariant kernels, at COLUMNS=80."""
    tmp = tmp_path_factory.mktemp("columns80")
    (tmp / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    out = nondet("probe", "--prompts", str(tmp / "prompts.txt"), "-b", "1,2", "-n", "4", "--inject-variance",
                 "--confirm", "--out", str(tmp / "run"))
    return out, json.loads((tmp / "run" / "summary.json").read_text())


@pytest.fixture(scope="module")
def bisect_run(tmp_path_factory, default_model_dir):
    """`nondet bisect` with no RUN_DIR (one prompt: the probe's conditions table), ablation included."""
    run = tmp_path_factory.mktemp("columns80-bisect") / "run"
    out = nondet("bisect", "-b", "1,4", "-n", "4", "--inject-variance", "--out", str(run))
    return out, run


def test_probe_confirm_at_80_columns_shows_every_header_whole(confirm_run):
    out, summary = confirm_run
    assert_fits(out)
    modes = list(summary["modes"])
    assert modes == ["default", "batch-invariant"]
    # one table per kernels mode, then the side-by-side comparison (narrow enough to keep its headers)
    assert headers(out) == [PROMPT_HEADERS, PROMPT_HEADERS, ["", *modes]]
    assert "first numeric divergence" in out  # the side-by-side's row label, whole
    legend = [line.strip() for line in out.splitlines() if line.strip().startswith(("token:", "numeric:"))]
    assert legend == ["token: first step whose token differs from the reference",  # under each table, unwrapped
                      "numeric: first step whose sampled-token logprob bits differ from it"] * 2


def test_probe_tables_keep_their_full_headers_where_they_fit(confirm_run):
    _, summary = confirm_run
    wide = rendered(summary, 200)
    assert headers(wide)[:2] == [["prompt", "text", "runs", "distinct", *WIDE_DIVERGENCE]] * 2
    assert "token: first step" not in wide  # no legend where the headers say it
    assert headers(rendered(summary, 80))[:2] == [PROMPT_HEADERS] * 2


def test_conditions_table_at_80_columns(bisect_run):
    """One prompt: one row per condition; full headers at 200 columns, short ones and the legend at 80."""
    _, run = bisect_run
    summary = json.loads((run / "summary.json").read_text())
    narrow = rendered(summary, 80)
    assert_fits(narrow)
    assert headers(narrow) == [CONDITION_HEADERS]
    assert headers(rendered(summary, 200)) == [["condition", "runs", "distinct", *WIDE_DIVERGENCE]]


def test_bisect_at_80_columns(bisect_run):
    out, run = bisect_run
    assert_fits(out)
    tables = headers(out)
    b = json.loads((run / "bisect.json").read_text())
    steps = _table_steps(b)  # the first difference, the lasting divergence, the flip: a table each
    # Which modules differ is the host's (here the injected norm's layers; where the host's own bf16
    # matmul is batch-variant, lm_head too): the full headers where that table fits, the short ones else.
    modules = module_rows(run)
    console = Console(file=StringIO(), width=80)
    expected = [list(MODULE_COLUMNS) if natural_width(console, _modules_table(s, b, modules)) <= 80
                else list(NARROW_MODULE_COLUMNS) for s in steps]
    assert tables[:len(steps)] == expected
    if list(NARROW_MODULE_COLUMNS) in expected:
        assert "points differ; every column: bisect_modules.csv" in out
    assert b["ablation"] and tables[len(steps):] == [["op classes", "tokens", "bits", "flip", "first differing point"]]
    legend = [line.strip() for line in out.splitlines() if line.strip().startswith(("tokens:", "flip:"))]
    assert legend == ["tokens: tokens match the reference; bits: every activation bit-identical",
                      "flip: token flip step; lasting: where the lasting divergence is born"]
    origin = b["origin"]["module"]
    assert any(line.startswith(f"│ {origin} ") for line in out.splitlines())  # a module path whole, not folded


def test_bisect_tables_keep_their_full_headers_where_they_fit(bisect_run):
    """At 200 columns (a wide terminal; a log without COLUMNS gets 140) the full tables, as before."""
    from nondet.cli.render_bisect import print_bisect

    _, run = bisect_run
    b = json.loads((run / "bisect.json").read_text())
    b.update(json.loads((run / "ablation.json").read_text()))
    buf = StringIO()
    print_bisect(b, _modules(run / "bisect_modules.csv"), Console(file=buf, width=200))
    tables = headers(buf.getvalue())
    assert tables[0] == ["layer", "module", "op class", "max abs", "max rel", "max ULP", "first diff index"]
    assert tables[-1] == ["op classes", "tokens match", "bit-identical", "flip step", "first differing point",
                          "lasting origin"]


def _modules(path) -> list[dict]:
    """bisect_modules.csv's rows with the types bisect gives print_bisect."""
    typed = {"step": int, "order": int, "max_ulp": int, "max_abs_diff": float, "max_rel_diff": float}
    optional = ("layer", "first_diff_index")
    return [{k: typed[k](v) if k in typed else (int(v) if v else None) if k in optional else
             v == "True" if k == "differs" else v for k, v in row.items()} for row in csv.DictReader(path.open())]


def _run_dir(path, logprobs: list[list[str]], fingerprint: dict) -> str:
    path.mkdir()
    (path / "fingerprint.json").write_text(json.dumps(fingerprint))
    records = [{"run_id": i, "condition_id": f"batch-invariant/p12/bs{1 + 31 * i}/rows/{31 * i}",
                "kernels": "batch-invariant", "position": 31 * i, "is_reference": i == 0, "prompt_id": 12,
                "steps": [{"token": 5, "logprob": lp} for lp in lps]} for i, lps in enumerate(logprobs)]
    (path / "streams.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "summary.json").write_text('{"modes": {}}')
    return str(path)


def test_compare_at_80_columns_folds_between_items(tmp_path):
    same, other = ["-0x1.8p-1", "-0x1.0p-2"], ["-0x1.8p-1", "-0x1.0000000000001p-2"]
    fp = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu128", "transformers": "5.24.0"}
    a = _run_dir(tmp_path / "a", [same, same], fp)
    b = _run_dir(tmp_path / "b", [same, other], {**fp, "device": "NVIDIA H200 141GB HBM3e", "torch": "2.12.0+cu130"})
    out = nondet("compare", a, b)
    assert out.splitlines() == [
        "environments differ in device: NVIDIA H100 80GB HBM3 | NVIDIA H200 141GB HBM3e;",
        "  torch: 2.11.0+cu128 | 2.12.0+cu130",
        "batch-invariant/p12/bs32/rows/31 row 31 prompt 12: first token divergence None,",
        "  first logprob-bits divergence 1",
        "1 of 2 streams bitwise equal"]
    piped = nondet("compare", a, b, columns=None)  # a log without COLUMNS: each line whole, for grep
    assert piped.splitlines()[0] == ("environments differ in device: NVIDIA H100 80GB HBM3 | NVIDIA H200 141GB "
                                     "HBM3e; torch: 2.11.0+cu128 | 2.12.0+cu130")


def test_fold_keeps_a_line_that_fits_and_breaks_a_long_item_between_words():
    assert fold("5 of 8 streams bitwise equal", 80) == ["5 of 8 streams bitwise equal"]
    assert fold("x" * 100, None) == ["x" * 100]
    assert fold("settings differ in a: 1 | 2; model: " + "word " * 20, 40) == [
        "settings differ in a: 1 | 2;", "  model: word word word word word word", "  word word word word word word word",
        "  word word word word word word word"]
