"""The op census kept between probes of one model (nondet/probes/core/saved_census.py).

Positive controls (the census runs again): the model's weights file rewritten, a module swapped after the
load, a class's forward patched, the store's file corrupted, NONDET_SAVED_CENSUS=0, a model with no folder.
Negative control: the same model loaded again reads the census and runs no forward. A stored census that holds
an uncovered op still refuses the model, and a probe's fingerprint says where its census was taken.
"""

import json
import os

import pytest
import torch

import cli_runner
from nondet.errors import UnsupportedModelError
from nondet.kernels import census
from nondet.probes.core.kernel_coverage import census_entry
from nondet.probes.core.saved_census import ENV, saved_census
from nondet.probes.models.loading import ModelSpec, load_model


@pytest.fixture
def model_dir(tmp_path):
    """A tiny Qwen3 of its own (a test here rewrites its files)."""
    from model_fixtures import save_qwen3

    from nondet.probes.models.default_model import build_tokenizer

    return save_qwen3(tmp_path / "m", build_tokenizer(512), hidden=32, layers=1, heads=2, kv_heads=1, seed=3)


@pytest.fixture
def forwards(monkeypatch, tmp_path):
    """A cache of this test's own, no census in memory, and a count of the censuses that ran their forwards."""
    monkeypatch.setenv("NONDET_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(census, "_CACHE", {})
    ran = []
    original = census._run

    def counted(*args, **kwargs):
        ran.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(census, "_run", counted)
    return ran


def _entry(model_dir, monkeypatch) -> dict:
    """census_entry on the model loaded afresh, as a new process would take it (nothing in memory)."""
    monkeypatch.setattr(census, "_CACHE", {})
    model = load_model(ModelSpec(name=str(model_dir), dtype="float32")).model
    return census_entry(model, False, False, saved_census(model, False))


def test_the_same_model_loaded_again_reads_its_census_and_runs_no_forward(model_dir, forwards, monkeypatch):
    first = _entry(model_dir, monkeypatch)
    second = _entry(model_dir, monkeypatch)
    assert len(forwards) == 1  # the second took none
    assert first["taken"] == census.TAKEN_HERE and second["taken"].startswith("stored by an earlier run")
    assert {k: v for k, v in first.items() if k != "taken"} == {k: v for k, v in second.items() if k != "taken"}
    assert first["counts"]["routed"] > 0 and first["coverage"] == "invariant"


def test_rewritten_weights_run_the_census_again(model_dir, forwards, monkeypatch):
    _entry(model_dir, monkeypatch)
    weights = next(model_dir.glob("*.safetensors"))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # same size, new time: other weights
    assert _entry(model_dir, monkeypatch)["taken"] == census.TAKEN_HERE
    assert len(forwards) == 2


def test_a_module_swapped_after_the_load_or_a_patched_forward_runs_the_census_again(model_dir, forwards, monkeypatch):
    model = load_model(ModelSpec(name=str(model_dir), dtype="float32")).model
    before = saved_census(model, False).path
    layer = model.model.layers[0]
    act = layer.mlp.act_fn
    layer.mlp.act_fn = torch.nn.Tanh()  # a module of another class: another tree
    assert saved_census(model, False).path != before
    layer.mlp.act_fn = act
    assert saved_census(model, False).path == before  # the control: the same tree, the same store

    model.config._attn_implementation = "eager"  # loaded with another attention: another default forward
    assert saved_census(model, False).path != before
    model.config._attn_implementation = "sdpa"
    assert saved_census(model, False).path == before

    cls = type(layer.self_attn)
    original = cls.forward
    monkeypatch.setattr(cls, "forward", lambda self, *a, **k: original(self, *a, **k))
    assert saved_census(model, False).path != before
    assert saved_census(model, True).path != saved_census(model, False).path  # compiled: another census


def test_a_corrupted_record_runs_the_census_again_and_is_rewritten(model_dir, forwards, monkeypatch):
    _entry(model_dir, monkeypatch)
    model = load_model(ModelSpec(name=str(model_dir), dtype="float32")).model
    path = saved_census(model, False).path
    path.write_text('{"format": 1, "record": {"uses": [["", "aten::mm", "maybe", "", 1]]}, "taken_at": "x"}')
    assert _entry(model_dir, monkeypatch)["taken"] == census.TAKEN_HERE
    assert json.loads(path.read_text())["record"]["uses"]  # written again, readable
    assert _entry(model_dir, monkeypatch)["taken"].startswith("stored")
    assert len(forwards) == 2


def test_no_store_where_turned_off_or_the_model_has_no_folder(model_dir, forwards, monkeypatch):
    model = load_model(ModelSpec(name=str(model_dir), dtype="float32")).model
    assert saved_census(model, False) is not None  # the control
    monkeypatch.setenv(ENV, "0")
    assert saved_census(model, False) is None
    monkeypatch.delenv(ENV)
    model.config._name_or_path = ""  # a model built in memory
    assert saved_census(model, False) is None


def test_a_stored_census_with_an_uncovered_op_still_refuses(model_dir, forwards, monkeypatch):
    _entry(model_dir, monkeypatch)
    model = load_model(ModelSpec(name=str(model_dir), dtype="float32")).model
    path = saved_census(model, False).path
    stored = json.loads(path.read_text())
    stored["record"]["uses"].append(["model.layers.0.mlp", "aten::cumsum", census.UNCOVERED, "no invariant kernel", 1])
    path.write_text(json.dumps(stored))
    monkeypatch.setattr(census, "_CACHE", {})
    with pytest.raises(UnsupportedModelError, match="model.layers.0.mlp: aten::cumsum is not covered"):
        census_entry(model, False, False, saved_census(model, False))
    assert len(forwards) == 1  # refused from the record, not from a new census


def test_a_probes_fingerprint_says_where_its_census_was_taken(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("NONDET_CACHE", str(tmp_path / "cache"))
    taken = []
    for name in ("one", "two"):
        out = tmp_path / name
        result = cli_runner.run(["probe", "--model", str(model_dir), "--device", "cpu", "--dtype", "float32",
                                 "-b", "1,2", "-n", "3", "--confirm", "--out", str(out)], env=dict(os.environ))
        assert result.returncode == 0, result.stderr[-2000:]
        taken.append(json.loads((out / "fingerprint.json").read_text())["census"]["taken"])
    assert taken[0] == census.TAKEN_HERE and taken[1].startswith("stored by an earlier run")
