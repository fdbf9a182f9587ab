"""One prompt-file format: JSONL (strings or {"prompt": ...}, newlines allowed) or plain lines."""

import json
import subprocess
import sys

import pytest

from nondet.errors import UsageError
from nondet.prompt_file import read_prompt_file

CODE = "def fibonacci(n):\n    a, b = 0, 1\n    return a"


def test_jsonl_keeps_newlines_and_accepts_both_forms(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": CODE}) + "\n\n" + json.dumps("Tell me about Feynman") + "\n")
    assert read_prompt_file(f) == (CODE, "Tell me about Feynman")


def test_plain_text_is_one_prompt_a_line(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("first prompt\n\nsecond {not json}\n")
    assert read_prompt_file(f) == ("first prompt", "second {not json}")


@pytest.mark.parametrize("line,message", [
    ('{"prompt": ', "p.jsonl:2: not valid JSON"),
    ('{"text": "x"}', "p.jsonl:2: expected a JSON string"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "p.jsonl:2: chat messages are not supported"),
])
def test_a_bad_line_is_one_line_naming_file_and_line(tmp_path, line, message):
    f = tmp_path / "p.jsonl"
    f.write_text('"fine"\n' + line + "\n")
    with pytest.raises(UsageError) as info:
        read_prompt_file(f)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_probe_and_rl_read_a_jsonl_prompt_with_a_newline(tmp_path, tiny_model_dir):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": CODE}) + "\n")
    probe = subprocess.run([sys.executable, "-m", "nondet", "probe", "--model", str(tiny_model_dir), "--prompts", str(f),
                            "-b", "1,2", "-n", "3", "--out", str(tmp_path / "run")], capture_output=True, text=True,
                           timeout=300)
    assert probe.returncode == 0, probe.stderr[-1500:]
    config = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert config["prompt"] == CODE  # the newlines reached the probe
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    rl = subprocess.run([sys.executable, "-m", "nondet", "rl", "--model", str(tiny_model_dir), "--prompts", str(bad)],
                        capture_output=True, text=True, timeout=300)
    assert rl.returncode == 2 and "bad.jsonl:1: not valid JSON" in rl.stderr
