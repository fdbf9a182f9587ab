"""Typed run-directory records: one writer, a validating reader, old formats, a new source.

No model: a toy source (the Source interface, in a dozen lines) goes through the real probe
loop and writer, and the files it leaves are read back, reported, and broken on purpose.
"""

import json
import os
import subprocess

import pytest

from nondet.errors import RunDirError
from nondet.probes.probe import run_streams
from nondet.probes.core.source import Opened, Planned
from nondet.probes.core.summarize import as_summary, summarize_modes
from nondet.rundir import RunDir
from nondet.rundir.reader import read_conditions, read_header, read_streams, read_summary
from nondet.rundir.records import FORMAT_VERSION, ConditionRecord, StepRecord, StreamRecord, to_json
from nondet.rundir.writer import RunWriter, new_header
import cli_runner

TOKENS = {"ref": [1, 2, 3, 4], "same": [1, 2, 3, 4], "flip": [1, 2, 9, 4]}


class ToySource:
    """Three conditions with fixed token streams; the 'flip' one changes token 2 (a raw byte)."""

    kind = "toy"

    def open(self):
        return Opened({"model": {"name": "toy"}})

    def attach(self, writer):
        pass

    def plan(self):
        return [Planned(f"default/toy/{name}", name, "default", name) for name in TOKENS]

    def replay(self, planned, emit):
        name = planned.plan
        steps = [StepRecord(t, piece="\udcff" if t == 9 else f"t{t}", logprob=(-0.5 - t / 8).hex()) for t in TOKENS[name]]
        emit(StreamRecord(run_id=list(TOKENS).index(name), condition_id=planned.condition_id, kernels="default",
                          position=0, is_reference=name == "ref", steps=steps, extra={"toy_field": name}))
        return ConditionRecord(planned.condition_id, "default", 1 if name == "ref" else 2, [0],
                               "none" if name == "ref" else "same-length", name, load="toy")

    def summarize(self, streams):
        return as_summary(summarize_modes(streams))

    def close(self):
        pass


@pytest.fixture
def toy_run(tmp_path):
    writer = RunWriter(RunDir(tmp_path / "run"))
    source = ToySource()
    writer.write_header(new_header("probe", {"prompt": "toy"}, ["nondet", "probe"]), source.open().fingerprint)
    streams = run_streams(source, writer)
    writer.write_summary(source.summarize(streams))
    return tmp_path / "run"


def test_a_new_source_needs_no_change_to_the_loop_the_writer_or_the_diff(toy_run):
    rd = RunDir(toy_run)
    assert read_header(rd).format_version == FORMAT_VERSION
    assert [c.condition_id for c in read_conditions(rd)] == ["default/toy/ref", "default/toy/same", "default/toy/flip"]
    streams = read_streams(rd)
    assert streams[2].steps[2].piece == "\udcff" and streams[2].extra == {"toy_field": "flip"}
    summary = read_summary(rd)
    assert summary.modes["default"]["distinct_completions"] == 2
    assert summary.modes["default"]["first_token_divergence"] == 2
    assert summary.modes["default"]["first_numeric_divergence"] == 2


def test_records_round_trip_exactly(toy_run):
    rd = RunDir(toy_run)
    lines = [json.loads(x) for x in (toy_run / "streams.jsonl").read_text().splitlines()]
    assert [to_json(s) for s in read_streams(rd)] == lines


def test_a_format_1_directory_still_reads(toy_run):
    # Written before typed records: no format_version, no prompt_id anywhere.
    config = json.loads((toy_run / "config.json").read_text())
    del config["format_version"]
    (toy_run / "config.json").write_text(json.dumps(config))
    for name in ("conditions.jsonl", "streams.jsonl"):
        lines = [json.loads(x) for x in (toy_run / name).read_text().splitlines()]
        (toy_run / name).write_text("".join(json.dumps({k: v for k, v in x.items() if k != "prompt_id"}) + "\n"
                                            for x in lines))
    rd = RunDir(toy_run)
    assert read_header(rd).format_version == 1
    assert {s.prompt_id for s in read_streams(rd)} == {0}


def test_a_newer_format_is_refused_naming_both_versions(toy_run):
    config = json.loads((toy_run / "config.json").read_text())
    config["format_version"] = FORMAT_VERSION + 1
    (toy_run / "config.json").write_text(json.dumps(config))
    with pytest.raises(RunDirError, match=f"format {FORMAT_VERSION + 1} is newer than this nondet reads "
                                          f"\\({FORMAT_VERSION}\\)"):
        read_header(RunDir(toy_run))


@pytest.mark.parametrize("name, line, field", [
    ("conditions.jsonl", 2, "kernels"), ("streams.jsonl", 1, "is_reference"), ("streams.jsonl", 3, "steps")])
def test_a_record_of_the_wrong_shape_names_file_record_and_field(toy_run, name, line, field):
    lines = (toy_run / name).read_text().splitlines()
    record = json.loads(lines[line - 1])
    record[field] = 5
    lines[line - 1] = json.dumps(record)
    (toy_run / name).write_text("\n".join(lines) + "\n")
    reader = read_conditions if name == "conditions.jsonl" else read_streams
    with pytest.raises(RunDirError, match=f"{name}:{line}: field '{field}' must be"):
        reader(RunDir(toy_run))


def _report(run) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NONDET_DEBUG"}
    return cli_runner.run(["report", str(run)], env=env, timeout=120)


def test_report_on_a_bisect_json_that_is_a_list_exits_4(toy_run):
    (toy_run / "bisect.json").write_text("[1,2,3]\n")
    r = _report(toy_run)
    assert r.returncode == 4, r.stderr
    assert r.stderr == f"nondet: error: {toy_run / 'bisect.json'}: expected a JSON object, found a list\n"


def test_report_on_a_condition_with_a_numeric_kernels_exits_4(toy_run):
    lines = (toy_run / "conditions.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"kernels":"default"', '"kernels":5')
    (toy_run / "conditions.jsonl").write_text("\n".join(lines) + "\n")
    r = _report(toy_run)
    assert r.returncode == 4, r.stderr
    assert r.stderr == (f"nondet: error: {toy_run / 'conditions.jsonl'}:2: field 'kernels' must be "
                        "a string, found a number 5\n")


def test_report_renders_the_toy_run(toy_run):
    r = _report(toy_run)
    assert r.returncode == 0, r.stderr
    assert "\\xff" in (toy_run / "report.md").read_text(encoding="utf-8")
