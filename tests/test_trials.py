"""--trials N: every static batch N times, each repeat with the fillers rotated, the reference once."""

import json

import pytest

import cli_runner
from nondet.probes.core.batch import build_batch
from nondet.probes.core.conditions import Condition, plan_conditions, with_trials


def test_every_batch_with_a_filler_row_repeats_and_the_reference_runs_once():
    plan = with_trials(plan_conditions((1, 3, 4), "ends", None, False, "default"), 3, fillers=5)
    ids = [c.condition_id for c in plan]
    assert ids == ["default/bs1/ref", "default/bs3/ends", "default/bs4/ends", "default/bs3/ends/t2",
                   "default/bs4/ends/t2", "default/bs3/ends/t3", "default/bs4/ends/t3"]
    assert [c.trial for c in plan] == [0, 0, 0, 1, 1, 2, 2] and plan[-1].label == "bs=4 pos=0,3 trial 3"
    assert with_trials(plan[:3], 1, fillers=5) == plan[:3]


def test_a_batch_that_would_repeat_itself_runs_once():
    """bs 2 with --positions ends holds two targets and no filler; one filler text rotates into itself: a
    repeat would be the same batch, counted as new runs (it was, 8 runs for 4 trials of bs 2)."""
    plan = plan_conditions((1, 2, 3), "ends", None, False, "default")
    assert [c.condition_id for c in with_trials(plan, 3, fillers=5)][3:] == ["default/bs3/ends/t2",
                                                                            "default/bs3/ends/t3"]
    assert with_trials(plan, 3, fillers=1) == plan  # the control above: five filler texts do repeat bs 3
    ragged = plan_conditions((1, 3), "ends", None, True, "default")
    assert any(c.fillers == "ragged" and c.trial for c in with_trials(ragged, 2, fillers=1))  # lengths rotate


def test_a_later_trial_puts_other_fillers_around_the_same_target():
    target, fillers = [1, 2, 3], [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    first = Condition("default/bs3/last", "default", 3, (2,), "same-length")
    again = Condition("default/bs3/last/t2", "default", 3, (2,), "same-length", trial=1)
    a, b = build_batch(first, target, fillers, 0), build_batch(again, target, fillers, 0)
    assert a.input_ids[2] == b.input_ids[2] == target
    assert a.input_ids[:2] == [[10, 11, 12], [20, 21, 22]] and b.input_ids[:2] == [[20, 21, 22], [30, 31, 32]]


def test_trials_add_runs_to_the_interval(tmp_path, tiny_model_dir):
    done = cli_runner.run(["probe", "--model", str(tiny_model_dir), "-p", "one two three", "-b", "1,3",
                           "--trials", "4", "-n", "3", "--out", str(tmp_path / "r"), "--json"])
    assert done.returncode == 0, done.stderr
    mode = json.loads(done.stdout)["modes"]["default"]
    assert mode["n_runs"] == 1 + 4 * 2 and mode["confidence"]["runs"] == 8  # ends: 2 targets a batch, 4 trials
    records = [json.loads(line) for line in (tmp_path / "r" / "conditions.jsonl").read_text().splitlines()]
    assert [r.get("trial", 0) for r in records] == [0, 0, 1, 2, 3]


def test_trials_where_no_batch_has_a_filler_row_are_refused(tmp_path, tiny_model_dir):
    done = cli_runner.run(["probe", "--model", str(tiny_model_dir), "-p", "one two three", "-b", "1,2",
                           "--trials", "4", "-n", "3", "--out", str(tmp_path / "r")])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--trials repeats each batch with other requests in its filler rows" in done.stderr
    # refused once the tokenizer had loaded and the header was written: no run directory is left behind,
    # and a folder the user made stays (empty)
    assert not (tmp_path / "r").exists()
    (tmp_path / "mine").mkdir()
    done = cli_runner.run(["probe", "--model", str(tiny_model_dir), "-p", "one two three", "-b", "1,2",
                           "--trials", "4", "-n", "3", "--out", str(tmp_path / "mine")])
    assert done.returncode == 2 and list((tmp_path / "mine").iterdir()) == []


def test_a_refused_start_discards_the_header_only_where_no_condition_ran(tmp_path):
    """RunWriter.discard_unstarted: the header's files (and the folder it made) go; control: a directory that
    holds a condition record keeps every file."""
    from nondet.rundir import RunDir
    from nondet.rundir.writer import RunWriter, new_header

    for ran in (False, True):
        writer = RunWriter(RunDir(tmp_path / f"run-{ran}"))
        writer.write_header(new_header("probe", {}, []), {})
        if ran:
            writer.run_dir.append_jsonl("conditions.jsonl", {"condition_id": "default/bs1/ref"})
        writer.discard_unstarted()
        kept = sorted(p.name for p in writer.run_dir.path.iterdir()) if writer.run_dir.path.exists() else None
        assert kept == (["conditions.jsonl", "config.json", "fingerprint.json"] if ran else None)


@pytest.mark.parametrize("args, said", [(["--trials", "0"], "--trials must be >= 1, not 0"),
                                        (["--trials", "2", "--load", "continuous"], "--trials repeats static batches")])
def test_bad_trials_are_one_line(tmp_path, args, said):
    done = cli_runner.run(["probe", "-b", "1,2", "-n", "2", "--out", str(tmp_path / "r"), *args])
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr
