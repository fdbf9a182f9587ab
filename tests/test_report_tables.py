"""nondet.reports.read_tables: DataFrames with the documented columns and the run's numbers."""

import pandas as pd
import pytest
from report_fixtures import BAD_BYTE, SCRIPT, write_run

from nondet.errors import RunDirError
from nondet.reports import read_tables
from nondet.reports.tables import (ABLATION_COLUMNS, CONDITION_COLUMNS, MODULE_COLUMNS, RUN_COLUMNS,
                                   STREAM_COLUMNS)


def test_tables_have_documented_columns(tmp_path):
    t = read_tables(write_run(tmp_path / "run", bisect=True))
    assert list(t.streams.columns) == STREAM_COLUMNS
    assert list(t.runs.columns) == RUN_COLUMNS
    assert list(t.conditions.columns) == CONDITION_COLUMNS
    assert list(t.bisect_modules.columns) == MODULE_COLUMNS
    assert list(t.ablation.columns) == ABLATION_COLUMNS
    assert all(isinstance(df, pd.DataFrame) for df in (t.streams, t.runs, t.conditions, t.completions))


def test_streams_one_row_per_run_and_step(tmp_path):
    t = read_tables(write_run(tmp_path / "run"))
    assert len(t.runs) == 8 and len(t.streams) == 8 * 14
    run6 = t.streams[t.streams.run_id == 6].set_index("step")
    assert run6.loc[8, "piece"] == SCRIPT and run6.loc[9, "piece"] == BAD_BYTE
    assert run6.loc[0, "logprob"] == -0.25 and run6.loc[0, "logprob_hex"] == (-0.25).hex()
    assert run6.loc[5, "margin"] == 2.0 ** -7
    assert len(run6.loc[0, "top_ids"]) == 5


def test_conditions_and_runs_carry_the_diff(tmp_path):
    t = read_tables(write_run(tmp_path / "run"))
    c = t.conditions.set_index("condition_id")
    assert c.loc["default/bs4/ends", "distinct_completions"] == 2
    assert c.loc["default/bs4/ends", "first_token_divergence"] == 5
    assert pd.isna(c.loc["default/bs1", "first_numeric_divergence"])
    assert c.loc["default/bs8/ends", "batch_size"] == 8
    r = t.runs.set_index("run_id")
    assert r.loc[6, "first_token_divergence"] == 8 and r.loc[6, "completion_id"] == 2
    assert r.loc[0, "is_reference"] and r.loc[0, "batch_size"] == 1
    assert t.runs.first_token_divergence.dtype == "Int64"


def test_bisect_tables_empty_before_bisect(tmp_path):
    t = read_tables(write_run(tmp_path / "run"))
    assert t.bisect is None and t.minimal_set is None
    assert t.bisect_modules.empty and list(t.bisect_modules.columns) == MODULE_COLUMNS
    assert t.ablation.empty and t.amplification.empty


def test_bisect_tables(tmp_path):
    t = read_tables(write_run(tmp_path / "run", bisect=True))
    m = t.bisect_modules
    assert set(m.step) == {1, 5}
    assert pd.isna(m.layer.iloc[0]) and m.module.iloc[0] == "model.embed_tokens" and not m.differs.iloc[0]
    assert m.layer.dtype == "Int64" and m.differs.dtype == bool
    assert t.minimal_set == ["matmul"] and t.ablation.ops.iloc[0] == ["matmul"]
    assert len(t.amplification) == 6 * 4


def test_ablation_inside_bisect_json_is_read_too(tmp_path):
    from nondet.rundir import RunDir

    run = write_run(tmp_path / "run", bisect=True)
    rd = RunDir(run)
    b = rd.read_json("bisect.json")
    b.update(rd.read_json("ablation.json"))
    rd.write_json("bisect.json", b)
    (run / "ablation.json").unlink()
    t = read_tables(run)
    assert t.minimal_set == ["matmul"] and len(t.ablation) == 4


def test_missing_and_malformed_run_dirs(tmp_path):
    with pytest.raises(RunDirError, match="run directory not found"):
        read_tables(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError, match=r"conditions\.jsonl: missing; not a finished probe run"):
        read_tables(tmp_path / "empty")
    run = write_run(tmp_path / "run")
    (run / "summary.json").write_text('{"modes": {"default": {"runs": [{"oops": 1}]}}}')
    with pytest.raises(RunDirError, match=r"summary\.json, mode 'default': missing field 'n_runs'"):
        read_tables(run)
