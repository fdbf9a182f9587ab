"""Bad input for the speculative axis: one line, exit 2 or 3, never a traceback.

tests/test_speculative.py covers an unknown form, K < 1, a draft whose vocabulary has another
size and a draft directory that does not exist. Here: a draft that exists but cannot load, a
draft whose tokenizer has the target's size but other ids, and the gate's speculative flags
(--batch-sizes on a speculative-only gate used to be ignored silently).
"""

import json
import os
import shutil
from types import SimpleNamespace

import pytest

from nondet.errors import UsageError
from nondet.gate.config import resolve
from nondet.probes.speculative.speculation import parse_form
from nondet.probes.speculative.source import check_vocabulary
import cli_runner


def nondet(*args, cwd=None):
    return cli_runner.run(args, env=dict(os.environ), timeout=300, cwd=cwd)


# -- a draft with a different tokenizer ------------------------------------------------------


def _loaded(vocab: dict[str, int]):
    return SimpleNamespace(tokenizer=SimpleNamespace(get_vocab=lambda: dict(vocab)),
                           description={"vocab": len(vocab)})


def test_a_draft_whose_tokenizer_maps_the_same_size_vocabulary_to_other_ids_is_refused():
    target = _loaded({"a": 0, "b": 1, "c": 2})
    with pytest.raises(UsageError, match=r"^--speculative draft:D:2: the draft's vocabulary differs from the "
                                         r"target's \(3 vs 3 tokens, model vocab 3 vs 3\); a draft must use the "
                                         r"target's tokenizer$"):
        check_vocabulary(parse_form("draft:D:2"), target, _loaded({"a": 0, "b": 2, "c": 1}))
    check_vocabulary(parse_form("draft:D:2"), target, _loaded({"a": 0, "b": 1, "c": 2}))  # the same: accepted


# -- a draft that exists but cannot load -----------------------------------------------------


def test_cli_draft_directory_with_a_broken_config_exits_3(tmp_path, tiny_model_dir):
    broken = shutil.copytree(tiny_model_dir, tmp_path / "broken-draft")
    (broken / "config.json").write_text("{ not json")
    r = nondet("probe", "--model", str(tiny_model_dir), "--prompt", "hello", "-n", "2",
               "--speculative", f"draft:{broken}:2", "--out", str(tmp_path / "r"))
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith(f"nondet: error: --speculative draft:{broken}:2: draft model: ")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_cli_a_working_draft_of_the_same_tokenizer_runs(tmp_path, tiny_model_dir):
    """The negative control of the two above: the target as a named draft loads and probes."""
    r = nondet("probe", "--model", str(tiny_model_dir), "--prompt", "hello", "-n", "2", "--json",
               "--speculative", f"draft:{tiny_model_dir}:2", "--out", str(tmp_path / "r"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["speculative"]


# -- the gate's speculative axis -------------------------------------------------------------


BATCH_SIZES_IGNORED = ("--batch-sizes applies to the batch axis, which this gate does not run (axes: speculative) "
                       "(the speculative axis runs at batch size 1); drop it, or add --require identical to gate "
                       "the batch axis too")


def test_batch_sizes_on_a_speculative_only_gate_is_refused():
    with pytest.raises(UsageError) as exc:
        resolve({"speculative-forms": "ngram:4", "batch-sizes": "1,8"}, {})
    assert str(exc.value) == BATCH_SIZES_IGNORED


def test_batch_sizes_count_where_the_batch_axis_runs():
    both = resolve({"speculative-forms": "ngram:4", "batch-sizes": "1,4", "require": "identical"}, {})
    assert both.axes == ("batch", "speculative") and both.batch_sizes == (1, 4)
    # a file's batch-sizes serve its batch axis; a --speculative flag choosing another axis is no error
    flag_axis = resolve({"speculative-forms": "ngram:4"}, {"batch-sizes": [1, 4], "require": "identical"})
    assert flag_axis.axes == ("speculative",)


def test_batch_sizes_in_a_file_that_gates_only_the_speculative_axis_is_refused(tmp_path):
    path = tmp_path / "nondet.toml"
    with pytest.raises(UsageError, match=rf"^{path}: batch-sizes applies to the batch axis, which this gate "
                                         r"does not run \(axes: speculative\)"):
        resolve({}, {"speculative": "identical", "batch-sizes": [1, 8]}, path)


def test_cli_gate_speculative_with_batch_sizes_exits_2_before_any_model_loads(tmp_path):
    r = nondet("gate", "--speculative", "self:4", "--batch-sizes", "1,8", "--out", str(tmp_path / "g"), cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, f"nondet: error: {BATCH_SIZES_IGNORED}\n")
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize("forms, message", [
    ("beam:4", "--speculative-forms: unknown form 'beam:4'; use ngram:K, self:K, draft[:K] or draft:MODEL[:K]"),
    ("self:0", "--speculative-forms: K in 'self:0' must be >= 1 (tokens drafted per verification round)"),
])
def test_cli_gate_bad_speculative_forms_exit_2(tmp_path, forms, message):
    r = nondet("gate", "--speculative", forms, "--out", str(tmp_path / "g"), cwd=tmp_path)
    assert (r.returncode, r.stderr) == (2, f"nondet: error: {message}\n")
