"""nondet.rundir: the run directory's readers and writers."""

import pytest

from nondet.errors import PartialRunWarning, RunDirError
from nondet.rundir import RunDir, float_to_hex, hex_to_float


def test_json_round_trip_keeps_odd_text(tmp_path):
    rd = RunDir(tmp_path / "run")
    obj = {"piece": "\udcff<script>\x00\ufffd", "x": [1, 2.5, None]}
    rd.write_json("a.json", obj)
    assert rd.exists("a.json")
    assert rd.read_json("a.json") == obj
    assert (tmp_path / "run" / "a.json").read_bytes().isascii()


def test_jsonl_appends_and_reads_back(tmp_path):
    rd = RunDir(tmp_path)
    for i in range(3):
        rd.append_jsonl("s.jsonl", {"run_id": i, "piece": "\udc80"})
    assert rd.read_jsonl("s.jsonl") == [{"run_id": i, "piece": "\udc80"} for i in range(3)]


def test_jsonl_skips_a_torn_last_line(tmp_path):
    rd = RunDir(tmp_path)
    rd.append_jsonl("s.jsonl", {"run_id": 0})
    with open(tmp_path / "s.jsonl", "a") as f:
        f.write('{"run_id": 1, "ste')  # the process died mid-write
    with pytest.warns(PartialRunWarning, match=r"s\.jsonl:2: record cut off mid-write, left out"):
        assert rd.read_jsonl("s.jsonl") == [{"run_id": 0}]


def test_malformed_jsonl_line_is_a_run_dir_error(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(RunDirError, match=r"s\.jsonl:2: malformed JSON"):
        RunDir(tmp_path).read_jsonl("s.jsonl")


def test_missing_file_and_missing_dir(tmp_path):
    with pytest.raises(RunDirError, match="summary.json: missing from the run directory"):
        RunDir(tmp_path).read_json("summary.json")
    with pytest.raises(RunDirError, match="run directory not found"):
        RunDir(tmp_path / "nope").read_json("summary.json")


def test_malformed_json_is_a_run_dir_error(tmp_path):
    (tmp_path / "summary.json").write_text("{oops")
    with pytest.raises(RunDirError, match="malformed JSON at line 1"):
        RunDir(tmp_path).read_json("summary.json")


def test_csv_round_trip(tmp_path):
    rd = RunDir(tmp_path)
    rd.write_csv("m.csv", [{"step": 0, "layer": None, "differs": True}], ["step", "layer", "differs"])
    assert rd.read_csv("m.csv") == [{"step": "0", "layer": "", "differs": "True"}]


def test_hex_floats_are_bit_exact():
    x = -0.1 - 2.0 ** -40
    assert hex_to_float(float_to_hex(x)) == x
    assert hex_to_float(None) is None
    with pytest.raises(RunDirError, match="not a float.hex"):
        hex_to_float("zz")
