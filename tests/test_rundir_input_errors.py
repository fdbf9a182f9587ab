"""A run directory given to report, compare or bisect that is damaged, read-only or not a directory: one
`nondet: error:` line and exit 4 (bad flags: 2), found before any work, never an internal error (70) or a
silent exit 0. Each case has its control: the same command on a good run directory works.

Runs in process (main(), the CLI's one error boundary) on the synthetic run of report_fixtures. bisect's
replay, which needs a model, is replaced by a stand-in that reads and writes the run directory as the
real one does, so what is checked is everything around it: the checks before it and the writes after it.
"""

import errno
import json
import os
import re

import cli_runner
import pytest
from report_fixtures import write_run

from nondet.rundir import RunDir


def cli(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    return cli_runner.in_process(monkeypatch, capsys, *args)


def error(message: str) -> str:
    return f"nondet: error: {message}\n"


@pytest.fixture
def replay(monkeypatch, tmp_path):
    """bisect's replay of a probe run, stood in for: reads the streams as run_bisect does, writes bisect.json,
    bisect_modules.csv and ablation.json through bisect's own write_result. Returns the list of its calls."""
    from nondet.probes import bisect_probe
    from nondet.probes.bisect.bisect import BisectResult, write_result
    from nondet.rundir.reader import read_bisect, read_bisect_modules, read_stream_dicts

    source = RunDir(write_run(tmp_path / "bisected", bisect=True))
    ablation = json.loads(source.file("ablation.json").read_text())
    result = {**read_bisect(source), "ablation": ablation["ablation"], "minimal_set": ablation["minimal_set"]}
    rows = read_bisect_modules(source)
    calls = []

    def run(config, on_stage=None):
        calls.append(config)
        rd = RunDir(config.run_dir)
        read_stream_dicts(rd)
        write_result(rd, result, rows)
        return BisectResult(rd.path, result, rows, 0.5)

    monkeypatch.setattr(bisect_probe, "run_bisect", run)
    return calls


def _deny_writes(monkeypatch, path) -> None:
    """os.access says no for `path`, as for a read-only directory (chmod does not stop root, who runs these
    tests in CI containers; the check is os.access, so that is what is stood in for)."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: (real(p, mode, **kw) and not
                                                              (str(p) == str(path) and mode & os.W_OK)))


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _read_only(path) -> str:
    return (f"cannot write into {path}: read-only (permission denied); `nondet {{}}` writes {{}} there: copy the "
            "run directory somewhere writable and run it on the copy")


# -- A6: a read-only run directory ---------------------------------------------------------------


def test_report_on_a_read_only_run_directory_is_exit_4_before_any_work(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run")
    _deny_writes(monkeypatch, run)
    code, out, err = cli(monkeypatch, capsys, "report", run)
    assert (code, out) == (4, "")
    assert err == error(_read_only(run).format("report", "report.md, report.html and figures/"))
    assert not (run / "figures").exists()


def test_report_on_a_writable_run_directory_is_written(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run")
    assert cli(monkeypatch, capsys, "report", run) == (0, f"{run / 'report.md'}\n{run / 'report.html'}\n", "")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a chmod 555 directory")
def test_report_on_a_chmod_read_only_run_directory(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run")
    run.chmod(0o555)
    try:
        code, _, err = cli(monkeypatch, capsys, "report", run)
    finally:
        run.chmod(0o755)
    assert code == 4 and err.startswith(f"nondet: error: cannot write into {run}: read-only (permission denied)")


def test_a_read_only_mount_is_named(tmp_path, monkeypatch):
    from nondet.errors import RunDirError
    from nondet.rundir import writer

    _deny_writes(monkeypatch, tmp_path)
    monkeypatch.setattr(writer, "_read_only_mount", lambda path: True)
    with pytest.raises(RunDirError, match=r"read-only \(a read-only file system\); `nondet bisect` writes bisect"):
        writer.require_writable(RunDir(tmp_path), "bisect")


def test_a_report_write_that_fails_after_the_check_is_exit_4(tmp_path, monkeypatch, capsys):
    from nondet.reports import write

    run = write_run(tmp_path / "run")
    monkeypatch.setattr(write, "write_report_pages", _no_space)
    code, out, err = cli(monkeypatch, capsys, "report", run)
    assert (code, out, err) == (4, "", error(f"cannot write the report into {run}: No space left on device"))


def test_bisect_on_a_read_only_run_directory_is_exit_4_before_the_replay(tmp_path, monkeypatch, capsys, replay):
    run = write_run(tmp_path / "run")
    _deny_writes(monkeypatch, run)
    code, out, err = cli(monkeypatch, capsys, "bisect", run, "--json")
    assert (code, out) == (4, "")
    assert err == error(_read_only(run).format("bisect", "bisect.json, bisect_modules.csv and ablation.json"))
    assert replay == []


def test_bisect_whose_result_cannot_be_saved_prints_it_and_exits_4(tmp_path, monkeypatch, capsys, replay):
    from nondet.probes.bisect import bisect

    run = write_run(tmp_path / "run")
    monkeypatch.setattr(bisect, "write_bisect", _no_space)
    code, out, err = cli(monkeypatch, capsys, "bisect", run, "--json")
    assert code == 4
    assert json.loads(out)["condition_id"] == "default/bs8/ends"  # the replay's result, shown
    assert err == error(f"cannot write bisect's result into {run}: No space left on device; the result above "
                        "was not saved")
    assert not (run / "bisect.json").exists()


def test_bisect_on_a_good_run_directory_writes_its_result(tmp_path, monkeypatch, capsys, replay):
    run = write_run(tmp_path / "run")
    code, out, err = cli(monkeypatch, capsys, "bisect", run, "--json", "--no-ablation", "--max-steps", "3")
    assert (code, err) == (0, "")
    assert json.loads(out)["run_dir"] == str(run) and len(replay) == 1
    assert replay[0].max_steps == 3 and replay[0].ablation is False
    assert (run / "bisect.json").is_file() and (run / "report.md").is_file()


# -- A7, A8, E1: what bisect reads, checked before the model loads --------------------------------


def test_bisect_and_report_on_a_summary_that_is_a_list(tmp_path, monkeypatch, capsys, replay):
    run = write_run(tmp_path / "run")
    (run / "summary.json").write_text("[]\n")
    message = error(f"{run / 'summary.json'}: expected a JSON object, found a list")
    assert cli(monkeypatch, capsys, "bisect", run) == (4, "", message)
    assert cli(monkeypatch, capsys, "report", run) == (4, "", message)
    assert replay == []


def test_bisect_on_conditions_cut_after_their_second_line_names_the_missing_condition(tmp_path, monkeypatch, capsys,
                                                                                     replay):
    run = write_run(tmp_path / "run")
    lines = (run / "conditions.jsonl").read_text().splitlines(keepends=True)
    (run / "conditions.jsonl").write_text("".join(lines[:2]) + lines[2][:30])  # the third cut off mid-write
    code, out, err = cli(monkeypatch, capsys, "bisect", run)
    assert (code, out) == (4, "")
    assert err == (f"nondet: warning: {run / 'conditions.jsonl'}:3: record cut off mid-write, left out; what is "
                   f"read from {run} is partial\n"
                   + error(f"{run / 'conditions.jsonl'}: no record of condition 'default/bs4/ends' (run 3 diverged "
                           "in it); the file was cut off or edited: run the probe again"))
    assert replay == []


def test_choose_target_refuses_a_summary_run_without_its_fields(tmp_path):
    """The library call too (bisect_probe.run_bisect reads summary.json as stored): exit 4, not a KeyError."""
    from nondet.errors import RunDirError
    from nondet.probes.bisect.choose import choose_target

    summary = {"modes": {"default": {"reference_run_id": 0, "runs": [{"run_id": 1, "condition_id": "x"}]}}}
    with pytest.raises(RunDirError, match=r"summary.json, mode 'default', run 0: missing field 'position'"):
        choose_target([], summary, str(tmp_path))


@pytest.mark.parametrize("spoil, message", [
    (lambda run: (run / "streams.jsonl").write_text(
        (run / "streams.jsonl").read_text().replace('"steps":[', '"stepz":[', 1)),
     "{run}/streams.jsonl:1: missing field 'steps'"),
    (lambda run: (run / "fingerprint.json").write_text((run / "fingerprint.json").read_text()[:60]),
     "{run}/fingerprint.json: malformed JSON at line 4: Unterminated string starting at"),
], ids=["streams-record", "fingerprint-truncated"])
def test_bisect_finds_a_bad_record_before_the_model_loads(tmp_path, monkeypatch, capsys, replay, spoil, message):
    run = write_run(tmp_path / "run")
    spoil(run)
    code, out, err = cli(monkeypatch, capsys, "bisect", run)
    assert (code, out, err) == (4, "", error(message.format(run=run)))
    assert replay == []


# -- E2: one warning for one torn record -----------------------------------------------------------


def test_bisect_warns_once_about_a_torn_record(tmp_path, monkeypatch, capsys, replay):
    run = write_run(tmp_path / "run")
    text = (run / "streams.jsonl").read_text()
    (run / "streams.jsonl").write_text(text[:-40])
    code, out, err = cli(monkeypatch, capsys, "bisect", run, "--json")
    line = text.count("\n")
    assert code == 0 and len(replay) == 1  # checked, replayed, reported: three reads of streams.jsonl
    assert err == (f"nondet: warning: {run / 'streams.jsonl'}:{line}: record cut off mid-write, left out; what is "
                   f"read from {run} is partial\n")


# -- B4, B5: compare needs every record ------------------------------------------------------------


@pytest.mark.parametrize("spoil, message", [
    (lambda run: (run / "summary.json").write_text((run / "summary.json").read_text()[:200]),
     "{run}/summary.json: malformed JSON at line"),
    (lambda run: (run / "summary.json").write_text("[]"), "{run}/summary.json: expected a JSON object, found a list"),
    (lambda run: (run / "conditions.jsonl").write_text((run / "conditions.jsonl").read_text()[:-20]),
     "{run}/conditions.jsonl:5: record cut off mid-write (the run was interrupted or the file truncated); this "
     "needs the whole run directory"),
], ids=["summary-truncated", "summary-list", "conditions-cut-off"])
def test_compare_refuses_a_damaged_run(tmp_path, monkeypatch, capsys, spoil, message):
    good, bad = write_run(tmp_path / "good"), write_run(tmp_path / "bad")
    spoil(bad)
    code, out, err = cli(monkeypatch, capsys, "compare", good, bad)
    assert (code, out) == (4, "")
    assert err.startswith(error(message.format(run=bad)).rstrip("\n")) and err.count("\n") == 1


def test_compare_of_two_good_runs_is_exit_0(tmp_path, monkeypatch, capsys):
    good, other = write_run(tmp_path / "good"), write_run(tmp_path / "other")
    assert cli(monkeypatch, capsys, "compare", good, other) == (0, "8 of 8 streams bitwise equal\n", "")


# -- B6: a finished run that lost its streams ------------------------------------------------------


@pytest.mark.parametrize("command", ["report", "bisect", "compare"])
def test_an_empty_streams_file_of_a_finished_run_is_exit_4(tmp_path, monkeypatch, capsys, replay, command):
    run = write_run(tmp_path / "run")
    (run / "streams.jsonl").write_text("")
    args = (write_run(tmp_path / "good"), run) if command == "compare" else (run,)
    code, out, err = cli(monkeypatch, capsys, command, *args)
    assert (code, out) == (4, "")
    assert err == error(f"{run / 'streams.jsonl'} is empty, but summary.json counts 8 runs; the streams were lost "
                        "(copy the run directory again, or run the probe again)")
    assert replay == []


# -- B7: bisect's probe options with RUN_DIR ------------------------------------------------------


@pytest.mark.parametrize("flags, named", [
    (["-b", "1,4", "-n", "5", "--dtype", "float32", "--threads", "1"],
     "--batch-sizes, --max-new-tokens, --dtype and --threads apply"),
    (["--device", "cpu"], "--device applies"),  # the default's own value, given: still refused
    (["--attn-implementation", "eager", "--trust-remote-code", "--no-inject-variance"],
     "--attn-implementation, --trust-remote-code and --inject-variance apply"),
])
def test_bisect_refuses_the_probe_options_with_run_dir(tmp_path, monkeypatch, capsys, replay, flags, named):
    run = write_run(tmp_path / "run")
    code, out, err = cli(monkeypatch, capsys, "bisect", run, *flags)
    assert (code, out) == (2, "")
    assert err == error(f"{named} only without RUN_DIR (bisect replays the probe with its own settings, from "
                        "RUN_DIR/config.json)")
    assert replay == []


# -- C12: a file where a run directory belongs -----------------------------------------------------


@pytest.mark.parametrize("command", ["report", "bisect", "compare"])
def test_a_file_is_not_a_run_directory(tmp_path, monkeypatch, capsys, replay, command):
    path = tmp_path / "afile"
    path.write_text("notes\n")
    args = (write_run(tmp_path / "good"), path) if command == "compare" else (path,)
    code, out, err = cli(monkeypatch, capsys, command, *args)
    assert (code, out) == (4, "")
    assert err == error(f"{path} is a file, not a run directory (pass the directory `nondet probe` wrote)")


def test_the_same_file_twice_is_a_file_not_the_same_run(tmp_path, monkeypatch, capsys):
    path = tmp_path / "afile"
    path.write_text("notes\n")
    code, _, err = cli(monkeypatch, capsys, "compare", path, path)
    assert code == 4 and "is a file, not a run directory" in err


# -- D2, D4: each command's --help lists its exit codes -------------------------------------------


@pytest.mark.parametrize("command, codes", [
    ("report", ["0", "2", "4", "70", "130"]),
    ("compare", ["0", "1", "2", "4", "70", "130"]),
    ("bisect", ["0", "2", "3", "4", "70", "130"]),
])
def test_help_lists_the_exit_codes(monkeypatch, capsys, command, codes):
    code, out, _ = cli(monkeypatch, capsys, command, "--help")
    assert code == 0
    listed = out.split("Exit codes:")[1].split("Example")[0]
    assert re.findall(r"^\W*(\d+) ", listed, flags=re.M) == codes


def test_a_folder_of_other_files_is_not_written_into(tmp_path):
    from nondet.errors import UsageError
    from nondet.rundir.writer import refuse_a_used_run_dir

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    with pytest.raises(UsageError, match=rf"^--out {re.escape(str(mine))} holds other files \(notes.txt\), not a run "
                                         "directory; pass a new or empty folder$"):
        refuse_a_used_run_dir(str(mine))
    # the controls: a new folder, an empty one, a refused start's leftovers, hidden files
    refuse_a_used_run_dir(str(tmp_path / "new"))
    started = tmp_path / "started"
    started.mkdir()
    (started / "config.json").write_text("{}")
    (started / ".DS_Store").write_text("")
    refuse_a_used_run_dir(str(started))
