"""gate and the pytest plugin read prompt files with the one reader of probe and rl (nondet/prompt_file.py):
a JSONL prompt's newlines reach the probe intact, a {"messages": [...]} line is probed as a chat, a bad
line is one file:line usage error (exit 2)."""

import json
import os
from pathlib import Path

import pytest

from nondet.errors import UsageError
from nondet.gate.config import load_config, resolve
import cli_runner

CODE = "def fibonacci(n):\n    a, b = 0, 1\n    return a"
BAD_LINE_ERROR = ('{path}:2: not valid JSON (Expecting property name enclosed in double quotes); a line is a JSON '
                  'string, {{"prompt": "..."}} or {{"messages": [...]}}')
MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Why is the sky blue?\nOne sentence."}]


def jsonl(path: Path, *prompts) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return path


def gate(*args, cwd: Path):
    (cwd / ".git").mkdir(exist_ok=True)  # a repository root: no config file above it is read
    return cli_runner.run(["gate", *args], cwd=cwd, env={**os.environ, "GITHUB_ACTIONS": ""}, timeout=600)


def test_prompts_flag_keeps_a_jsonl_prompts_newlines_in_the_probe_config(tmp_path):
    from nondet.cli.gate import probe_configs

    f = jsonl(tmp_path / "p.jsonl", {"prompt": CODE})
    settings = resolve({"prompts-file": str(f)}, {})
    assert settings.prompts == (CODE,)
    [config] = probe_configs(settings, str(tmp_path / "run"))
    assert config.prompt == CODE


def test_config_key_is_relative_to_the_config_file(tmp_path):
    (tmp_path / "cfg").mkdir()
    jsonl(tmp_path / "cfg" / "p.jsonl", {"prompt": CODE}, "second")
    source = tmp_path / "cfg" / "nondet.toml"
    source.write_text('prompts-file = "p.jsonl"\n')
    assert resolve({}, load_config(source), source).prompts == (CODE, "second")


def test_plain_text_file_is_one_prompt_a_line(tmp_path):
    # negative control: a file that is not JSONL is not parsed as JSON, braces and all
    f = tmp_path / "p.txt"
    f.write_text("first prompt\n\nsecond {not json}\n")
    assert resolve({"prompts-file": str(f)}, {}).prompts == ("first prompt", "second {not json}")


def test_flags_replace_the_files_prompts(tmp_path):
    source = tmp_path / "nondet.toml"
    source.write_text('prompts = ["from the file"]\n')
    f = jsonl(tmp_path / "p.jsonl", "from the flag")
    assert resolve({"prompts-file": str(f)}, load_config(source), source).prompts == ("from the flag",)


@pytest.mark.parametrize("flags, text, message", [
    ({"prompts": ["a"], "prompts-file": "p.jsonl"}, "", "give either --prompt or --prompts FILE, not both"),
    ({}, 'prompts = ["a"]\nprompts-file = "p.jsonl"\n',
     "{source}: give one of prompt, prompts, prompts-file, not prompts and prompts-file"),
    ({}, "prompts-file = 3\n", "{source}: prompts-file must be a file path, not 3"),
    ({}, 'prompts-file = "missing.jsonl"\n', "cannot read prompts file {dir}/missing.jsonl: No such file or directory"),
])
def test_bad_prompt_sources_are_one_usage_error(tmp_path, flags, text, message):
    source = tmp_path / "nondet.toml"
    source.write_text(text)
    with pytest.raises(UsageError) as err:
        resolve(flags, load_config(source), source)
    assert str(err.value) == message.format(source=source, dir=tmp_path)


def test_cli_malformed_line_is_one_line_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"fine"\n{oops\n')
    r = gate("--prompts", str(bad), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == "nondet: error: " + BAD_LINE_ERROR.format(path=bad) + "\n"
    assert r.stdout == ""


def test_cli_malformed_line_from_the_config_file(tmp_path):
    (tmp_path / "bad.jsonl").write_text('"fine"\n{oops\n')
    (tmp_path / "nondet.toml").write_text('prompts-file = "bad.jsonl"\n')
    r = gate(cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == "nondet: error: " + BAD_LINE_ERROR.format(path=tmp_path / "bad.jsonl") + "\n"


def test_cli_gate_probes_the_jsonl_prompt_with_its_newlines(tmp_path, tiny_model_dir):
    jsonl(tmp_path / "p.jsonl", {"prompt": CODE})
    (tmp_path / "nondet.toml").write_text(f'model = {json.dumps(str(tiny_model_dir))}\nprompts-file = "p.jsonl"\n')
    r = gate("-b", "1,2", "-n", "3", "--kernels", "batch-invariant", "--no-bisect", "--out", "run",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    config = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert config["prompt"] == CODE  # the newlines reached the gate's probe


def test_cli_gate_probes_a_messages_line_as_a_chat(tmp_path, tiny_chat_model_dir):
    from transformers import AutoTokenizer

    from nondet.probes.core.chat import prompt_token_ids
    from nondet.prompt import as_prompt

    jsonl(tmp_path / "p.jsonl", {"messages": MESSAGES})
    (tmp_path / "nondet.toml").write_text(f'model = {json.dumps(str(tiny_chat_model_dir))}\nprompts-file = "p.jsonl"\n')
    r = gate("-b", "1,2", "-n", "3", "--kernels", "batch-invariant", "--no-bisect", "--out", "run",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["config"]["prompt"] == {"messages": MESSAGES}
    streams = [json.loads(line) for line in (tmp_path / "run" / "streams.jsonl").read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_model_dir)
    chat_ids = prompt_token_ids(tokenizer, as_prompt({"messages": MESSAGES}))  # == apply_chat_template's (test_prompt_file)
    assert {s["prompt_tokens"] for s in streams} == {len(chat_ids)}


def test_cli_gate_malformed_messages_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"fine"\n{"messages": [{"role": "user", "content": ""}]}\n')
    r = gate("--prompts", str(bad), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == f"nondet: error: {bad}:2: message 1: content must be non-empty text\n"


def test_a_messages_prompt_on_the_speculative_axis_is_refused_before_any_axis_runs(tmp_path):
    from nondet.cli.gate import gate_targets

    f = jsonl(tmp_path / "p.jsonl", {"messages": MESSAGES})
    settings = resolve({"prompts-file": str(f), "require": "identical", "speculative-forms": "ngram:2"}, {})
    assert settings.axes == ("batch", "speculative")
    with pytest.raises(UsageError, match=r"^a \{\"messages\": \[\.\.\.\]\} prompt runs on static batches and servers; "
                                         r"speculative decoding, --tp and --load continuous take plain-text prompts$"):
        gate_targets(settings, str(tmp_path / "run"))


# -- the pytest plugin ----------------------------------------------------------------------


def test_plugin_reads_a_prompts_file_with_newlines(tmp_path, tiny_model_dir):
    from nondet.probes.models.loading import ModelSpec, load_model
    from nondet.pytest_plugin import assert_batch_invariant

    loaded = load_model(ModelSpec(str(tiny_model_dir)))
    f = jsonl(tmp_path / "p.jsonl", {"prompt": CODE})
    verdicts = assert_batch_invariant(loaded.model, loaded.tokenizer, prompts_file=f, batch_sizes=(1, 2),
                                      max_new_tokens=2, kernels="batch-invariant")
    assert [v.name for v in verdicts] == [f"prompt {CODE!r}"]  # the whole prompt, newlines and all


def test_plugin_prompts_file_errors(tmp_path):
    from nondet.pytest_plugin import prompts_of

    bad = tmp_path / "bad.jsonl"
    bad.write_text('"fine"\n{oops\n')
    with pytest.raises(UsageError) as err:
        prompts_of(None, bad)
    assert str(err.value) == BAD_LINE_ERROR.format(path=bad)
    with pytest.raises(ValueError, match="^give either prompts or prompts_file, not both$"):
        prompts_of(["a"], bad)
    plain = tmp_path / "p.txt"
    plain.write_text("one\ntwo {x}\n")
    assert prompts_of(None, plain) == ("one", "two {x}")


def test_plugin_probes_a_messages_line_through_the_chat_template(tmp_path, tiny_chat_model_dir):
    from nondet.probes.models.loading import ModelSpec, load_model
    from nondet.pytest_plugin import assert_batch_invariant

    loaded = load_model(ModelSpec(str(tiny_chat_model_dir)))
    f = jsonl(tmp_path / "p.jsonl", {"messages": MESSAGES})
    verdicts = assert_batch_invariant(loaded.model, loaded.tokenizer, prompts_file=f, batch_sizes=(1, 2),
                                      max_new_tokens=2, kernels="batch-invariant")
    turns = "system: You answer briefly.\nuser: Why is the sky blue?\nOne sentence."
    assert [v.name for v in verdicts] == [f"prompt {turns[:60]!r}"]  # the turns, cut as every name is
