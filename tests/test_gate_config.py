"""Gate settings: flags over nondet.toml / [tool.nondet] over defaults; bad config = exit 2."""

import os
from pathlib import Path

import pytest

from nondet.errors import UsageError
from nondet.gate.config import GateSettings, find_config, load_config, resolve
from nondet.gate.policy import Policy
import cli_runner

NO_FLAGS: dict = {}


def settings_in(directory: Path, flags=NO_FLAGS) -> GateSettings:
    source = find_config(directory)
    return resolve(flags, load_config(source) if source else {}, source)


def test_defaults_without_a_config_file(tmp_path):
    (tmp_path / ".git").mkdir()
    assert settings_in(tmp_path) == GateSettings()
    assert GateSettings().policy == Policy("identical")
    assert settings_in(tmp_path).workers == "auto"  # helpers only where the sweep pays for them (auto_workers.py)


def test_pyproject_table_found_from_a_subdirectory(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "m"\n\n[tool.nondet]\nmodel = "weights"\nbatch-sizes = [1, 4]\n'
        'max-new-tokens = 32\nkernels = "batch-invariant"\nmax-distinct = 2\nprompts = ["a", "b"]\n')
    (tmp_path / "weights").mkdir()
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    s = settings_in(tmp_path / "src" / "pkg")
    assert s.model == str(tmp_path / "weights")  # relative to the config file, not the cwd
    assert (s.batch_sizes, s.max_new_tokens, s.kernels) == ((1, 4), 32, "batch-invariant")
    assert s.policy == Policy("max-distinct", 2) and s.prompts == ("a", "b")
    assert s.source == str(tmp_path / "pyproject.toml")


def test_search_stops_at_the_repository_root(tmp_path):
    (tmp_path / "nondet.toml").write_text('kernels = "batch-invariant"\n')
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    assert find_config(tmp_path / "repo") is None


def test_pyproject_without_the_table_is_not_a_config(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "m"\n')
    assert find_config(tmp_path) is None


def test_nondet_toml_wins_and_flags_win_over_it(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.nondet]\nmax-new-tokens = 5\n')
    (tmp_path / "nondet.toml").write_text('max-new-tokens = 7\nbatch-sizes = "1-4"\nrequire = "min-divergence-step = 20"\n'
                                          'load = "continuous"\nrate = 1\nconcurrency = 4\n')
    s = settings_in(tmp_path)
    assert (s.max_new_tokens, s.batch_sizes, s.policy) == (7, (1, 2, 3, 4), Policy("min-divergence-step", 20))
    assert (s.load, s.rate, s.concurrency, s.endpoint) == ("continuous", 1.0, 4, None)
    s = settings_in(tmp_path, {"max-new-tokens": 9, "batch-sizes": "1,8", "max-logprob-diff": 0.5, "model": "hub/id"})
    assert (s.max_new_tokens, s.batch_sizes, s.policy, s.model) == (9, (1, 8), Policy("max-logprob-diff", 0.5), "hub/id")


@pytest.mark.parametrize("text, message", [
    ("max-new-tokens = 'ten'\n", "{path}: max-new-tokens must be an integer, not 'ten'"),
    ("max-new-tokens = 0\n", "{path}: max-new-tokens must be >= 1, not 0"),
    ("batch_sizes = [1, 2]\n", "{path}: unknown key 'batch_sizes'; known keys: model, prompt, prompts, prompts-file, "
                               "batch-sizes, positions, runs, max-new-tokens, kernels, dtype, device, threads, workers, load, "
                               "endpoint, rate, concurrency, inject-variance, compile, cuda-graphs, fail-fast, prefix-cache, chunked-prefill, require, "
                               "max-distinct, min-divergence-step, max-logprob-diff, max-flip-rate, speculative, "
                               "speculative-forms, "
                               "rl, max-kl, micro-batch, sampler-batch"),
    ("batch-sizes = [1]\n", "{path}: batch-sizes needs a size > 1 (1 alone is only the reference)"),
    ("max-distinct = 2\nrequire = 'identical'\n", "{path}: give one requirement, not require and max-distinct"),
    ("max-distinct = 0\n", "{path}: max-distinct must be >= 1, not 0"),
    ("batch-sizes = '1-x'\n", "{path}: batch-sizes: '1-x' is not an integer or a range like 1-8"),
    ("prompts = ['ok', '']\n", "{path}: prompts must be a list of non-empty strings"),
    ("kernels = \n", "cannot parse {path}: Invalid value (at line 1, column 11)"),
    ("max-flip-rate = 1\n", "{path}: max-flip-rate is a rate in (0, 1), not 1"),
])
def test_bad_config_is_one_usage_error(tmp_path, text, message):
    path = tmp_path / "nondet.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        resolve({}, load_config(path), path)
    assert str(err.value) == message.format(path=path)


def test_pyproject_errors_name_the_table(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.nondet]\nthreads = "two"\n')
    with pytest.raises(UsageError, match=r"pyproject.toml \[tool.nondet\]: threads must be an integer, not 'two'$"):
        resolve({}, load_config(path), path)


def test_cli_bad_config_exits_2_with_one_line(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.nondet]\nmax-distinct = "many"\n')
    r = cli_runner.run(["gate"], cwd=tmp_path, timeout=120, env={**os.environ, "GITHUB_ACTIONS": ""})
    assert r.returncode == 2
    assert r.stderr == (f"nondet: error: {tmp_path / 'pyproject.toml'} [tool.nondet]: "
                        "max-distinct must be a number, not 'many'\n")


def test_cli_two_requirement_flags_exit_2(tmp_path):
    r = cli_runner.run(["gate", "--max-distinct", "2", "--require", "identical"], cwd=tmp_path, timeout=120)
    assert r.returncode == 2
    assert r.stderr == "nondet: error: give one requirement, not --require and --max-distinct\n"


@pytest.mark.parametrize("flags, message", [
    ({"batch-sizes": "1"}, "--batch-sizes needs a size > 1 (1 alone is only the reference)"),
    ({"max-new-tokens": 0}, "--max-new-tokens must be >= 1, not 0"),
    ({"max-distinct": 0}, "max-distinct must be >= 1, not 0"),
    ({"prompts": ["  "]}, "--prompt is empty"),
])
def test_bad_flags_are_named_as_flags(tmp_path, flags, message):
    (tmp_path / "nondet.toml").write_text("batch-sizes = [1, 8]\nmax-new-tokens = 4\nprompt = 'x'\n")
    with pytest.raises(UsageError) as err:
        resolve(flags, load_config(tmp_path / "nondet.toml"), tmp_path / "nondet.toml")
    assert str(err.value) == message


def test_max_flip_rate_is_a_key_and_a_flag_as_the_other_thresholds(tmp_path):
    path = tmp_path / "nondet.toml"
    path.write_text("max-flip-rate = 0.01\n")
    assert resolve({}, load_config(path), path).policy == Policy("max-flip-rate", 0.01)
    assert resolve({"max-flip-rate": 0.05}, {}).policy == Policy("max-flip-rate", 0.05)
    assert resolve({"require": "max-flip-rate = 0.05"}, {}).policy == Policy("max-flip-rate", 0.05)  # as before


def test_a_config_file_that_is_not_utf8_is_one_usage_error(tmp_path):
    path = tmp_path / "nondet.toml"
    path.write_bytes(b"prompt = 'caf\xe9'\n")
    with pytest.raises(UsageError, match=f"^cannot read config file {path}: not UTF-8 \\(byte 13\\)$"):
        load_config(path)
    path.write_bytes("prompt = 'café'\n".encode())
    assert load_config(path) == {"prompt": "café"}  # the control: UTF-8
