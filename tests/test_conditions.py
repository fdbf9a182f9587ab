import pytest

from nondet.errors import UsageError
from nondet.probes.core.batch import build_batch, fit_length
from nondet.probes.core.conditions import parse_batch_sizes, plan_conditions


def test_parse_batch_sizes_ranges_and_reference():
    assert parse_batch_sizes("4,2") == (1, 2, 4)
    assert parse_batch_sizes("1-4,8") == (1, 2, 3, 4, 8)


@pytest.mark.parametrize("text", ["0", "2,0", "a", "", "-3", "1,,2", "1,8,", "1,100000000000", "1-5000"])
def test_bad_batch_sizes(text):
    with pytest.raises(UsageError):
        parse_batch_sizes(text)


def test_a_huge_sweep_is_named():
    with pytest.raises(UsageError, match=r"^--batch-sizes: at most 1024 sizes of at most 65536 rows, not 2 up to 10"):
        parse_batch_sizes("1,100000000000")
    assert parse_batch_sizes("1-1024")[-1] == 1024 and parse_batch_sizes("1,65536")[-1] == 65536  # the controls


def test_an_empty_entry_is_named():
    with pytest.raises(UsageError, match=r"^--batch-sizes: an empty entry in '1,,2'"):
        parse_batch_sizes("1,,2")
    assert parse_batch_sizes(" 1, 2 ") == (1, 2)  # the control: spaces around sizes are fine


def test_empty_batch_sizes_on_the_demo_model_are_not_its_default(monkeypatch):
    from nondet.cli import probe_config
    from nondet.probes.models import demo_model

    monkeypatch.setattr(demo_model, "demo_kind", lambda: "trained")
    assert probe_config.demo_defaults((), False, "", None)[2] == ""  # refused by the config's check
    assert probe_config.demo_defaults((), False, None, None)[2] == demo_model.DEMO_BATCH_SIZES  # not given
    with pytest.raises(UsageError, match="--batch-sizes is empty"):
        probe_config.build_probe_config("probe", (), batch_sizes="")


def test_plan_reference_first_and_ends():
    plans = plan_conditions((1, 4, 8), "ends", None, False, "default")
    assert plans[0].is_reference and plans[0].batch_size == 1
    assert [(c.batch_size, c.positions) for c in plans[1:]] == [(4, (0, 3)), (8, (0, 7))]


def test_runs_spread_over_batches():
    plans = plan_conditions((1, 2, 4), "ends", 6, False, "default")
    rows = {c.batch_size: c.positions for c in plans}
    assert sum(len(p) for p in rows.values()) == 6
    assert rows[4] == (0, 1, 3) or len(rows[4]) == 3


def test_runs_beyond_capacity_is_usage_error():
    with pytest.raises(UsageError, match="--runs"):
        plan_conditions((1, 2), "ends", 10, False, "default")


def test_same_length_fillers_need_no_padding_and_ragged_does():
    target = [5, 6, 7, 8]
    plans = plan_conditions((1, 4), "first", None, True, "default")
    same, ragged = plans[1], plans[2]
    b = build_batch(same, target, [[1, 2], [3, 4, 5, 6, 7, 8, 9]], pad_id=0)
    assert all(len(r) == 4 for r in b.input_ids) and all(all(m) for m in b.attention_mask)
    assert b.input_ids[0] == target
    r = build_batch(ragged, target, [[1, 2], [3]], pad_id=0)
    assert ragged.fillers == "ragged" and any(0 in m for m in r.attention_mask)
    assert r.input_ids[ragged.positions[0]][-4:] == target


def test_fit_length_repeats_and_cuts():
    assert fit_length([1, 2], 5) == [1, 2, 1, 2, 1]
    assert fit_length([1, 2, 3], 2) == [1, 2]
