"""One prompt-file format: JSONL (strings or {"prompt": ...}, newlines allowed, or {"messages": [...]}
chats) or plain lines. A chat prompt reaches the model as the ids of its chat template."""

import json

import pytest

from nondet.errors import UsageError
from nondet.prompt import Chat, Message
from nondet.prompt_file import read_prompt_file
import cli_runner

CODE = "def fibonacci(n):\n    a, b = 0, 1\n    return a"
MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Why is the sky blue?\nOne sentence."}]


def nondet(*args):
    return cli_runner.run(args, timeout=300)


def template_ids(tokenizer, messages) -> list[int]:
    """What a server feeds the model for these messages: apply_chat_template, assistant's turn opened."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_jsonl_keeps_newlines_and_accepts_both_forms(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": CODE}) + "\n\n" + json.dumps("Tell me about Feynman") + "\n")
    assert read_prompt_file(f) == (CODE, "Tell me about Feynman")


def test_plain_text_is_one_prompt_a_line(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("first prompt\n\nsecond {not json}\n")
    assert read_prompt_file(f) == ("first prompt", "second {not json}")


def test_a_messages_line_is_a_chat_and_plain_lines_stay_text(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"messages": MESSAGES}) + "\n" + json.dumps("plain text") + "\n")
    chat, plain = read_prompt_file(f)
    assert chat == Chat((Message("system", "You answer briefly."), Message("user", "Why is the sky blue?\nOne sentence.")))
    assert chat.as_messages() == MESSAGES and plain == "plain text"


@pytest.mark.parametrize("line,message", [
    ('{"prompt": ', "p.jsonl:2: not valid JSON (Expecting value); a line is a JSON string, {\"prompt\": \"...\"} or "
                    "{\"messages\": [...]}"),
    ('{"text": "x"}', "p.jsonl:2: expected a JSON string, {\"prompt\": \"...\"} or {\"messages\": [...]} with "
                      "non-empty text"),
    ('{"messages": []}', "p.jsonl:2: \"messages\" must be a non-empty list of {\"role\": ..., \"content\": ...}"),
    ('{"messages": "hi"}', "p.jsonl:2: \"messages\" must be a non-empty list of {\"role\": ..., \"content\": ...}"),
    ('{"messages": ["hi"]}', "p.jsonl:2: message 1: expected {\"role\": ..., \"content\": ...}, not \"hi\""),
    ('{"messages": [{"role": "user"}]}', "p.jsonl:2: message 1: expected the keys role and content, not role"),
    ('{"messages": [{"role": "user", "content": "a", "name": "x"}]}',
     "p.jsonl:2: message 1: expected the keys role and content, not content, name, role"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}',
     "p.jsonl:2: message 2: role must be one of system, user, assistant, not 'tool'"),
    ('{"messages": [{"role": "user", "content": 3}]}', "p.jsonl:2: message 1: content must be non-empty text"),
    ('{"messages": [{"role": "user", "content": " "}]}', "p.jsonl:2: message 1: content must be non-empty text"),
    ('{"prompt": "a", "messages": [{"role": "user", "content": "a"}]}',
     "p.jsonl:2: give \"prompt\" or \"messages\", not both"),
])
def test_a_bad_line_is_one_line_naming_file_and_line(tmp_path, line, message):
    f = tmp_path / "p.jsonl"
    f.write_text('"fine"\n' + line + "\n")
    with pytest.raises(UsageError) as info:
        read_prompt_file(f)
    assert str(info.value) == f"{tmp_path}/{message}"


def test_a_chat_prompts_ids_are_its_chat_templates(tiny_chat_model_dir):
    """In process, a messages prompt is fed as apply_chat_template(messages, add_generation_prompt=True):
    the probe's batches (model_texts -> tokenize_inputs), rl's sampler (prompt_token_ids) and bisect's
    replay (config.json's form) all give those ids."""
    from transformers import AutoTokenizer

    from nondet.probes.core.batch import tokenize_inputs
    from nondet.probes.static.bisect import probe_prompts
    from nondet.probes.core.chat import model_texts, prompt_token_ids

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_model_dir)
    chat = Chat(tuple(Message(**m) for m in MESSAGES))
    expected = template_ids(tokenizer, MESSAGES)
    [text] = model_texts(tokenizer, [chat], chat=False)
    assert tokenize_inputs(tokenizer, text, ())[0] == expected
    assert prompt_token_ids(tokenizer, chat) == expected
    assert probe_prompts({"prompts": [{"messages": MESSAGES}, "plain"]}, tokenizer) == [text, "plain"]
    # negative control: the same turns without the template, or under --system, are other ids
    assert prompt_token_ids(tokenizer, "Why is the sky blue?\nOne sentence.") != expected
    assert model_texts(tokenizer, ["Why is the sky blue?\nOne sentence."], True, "Other.")[0] != text


def test_a_chat_prompt_needs_a_chat_template(tiny_model_dir):
    from transformers import AutoTokenizer

    from nondet.probes.core.chat import prompt_token_ids

    with pytest.raises(UsageError, match=r"^a \{\"messages\": \[\.\.\.\]\} prompt is sent through the model's chat "
                                         r"template, and its tokenizer has none; give the prompt as plain text$"):
        prompt_token_ids(AutoTokenizer.from_pretrained(tiny_model_dir), Chat((Message("user", "hi"),)))


def test_probe_and_rl_read_a_jsonl_prompt_with_a_newline(tmp_path, tiny_model_dir):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": CODE}) + "\n")
    probe = cli_runner.run(["probe", "--model", str(tiny_model_dir), "--prompts", str(f), "-b", "1,2", "-n", "3", "--out", str(tmp_path / "run")], timeout=300)
    assert probe.returncode == 0, probe.stderr[-1500:]
    config = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert config["prompt"] == CODE  # the newlines reached the probe
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    rl = cli_runner.run(["rl", "--model", str(tiny_model_dir), "--prompts", str(bad)], timeout=300)
    assert rl.returncode == 2 and "bad.jsonl:1: not valid JSON" in rl.stderr


def test_probe_and_rl_send_a_messages_line_through_the_chat_template(tmp_path, tiny_chat_model_dir):
    from transformers import AutoTokenizer

    expected = template_ids(AutoTokenizer.from_pretrained(tiny_chat_model_dir), MESSAGES)
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"messages": MESSAGES}) + "\n")
    probe = nondet("probe", "--model", str(tiny_chat_model_dir), "--prompts", str(f), "-b", "1,2", "-n", "3",
                   "--out", str(tmp_path / "run"))
    assert probe.returncode == 0, probe.stderr[-1500:]
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["config"]["prompt"] == {"messages": MESSAGES}
    streams = [json.loads(line) for line in (run / "streams.jsonl").read_text().splitlines()]
    assert {s["prompt_tokens"] for s in streams} == {len(expected)}
    report = (run / "report.md").read_text()
    assert "| p0 | system | `You answer briefly.` |\n|  | user | `Why is the sky blue?\\nOne sentence.` |" in report
    rl = nondet("rl", "--model", str(tiny_chat_model_dir), "--prompts", str(f), "--micro-batch", "1",
                "--max-new-tokens", "2", "--out", str(tmp_path / "rl"))
    assert rl.returncode == 0, rl.stderr[-1500:]
    sampled = [json.loads(line) for line in (tmp_path / "rl" / "streams.jsonl").read_text().splitlines()]
    assert [s["prompt_ids"] for s in sampled if s.get("side") == "sampler"] == [expected]


@pytest.mark.parametrize("command", ["probe", "rl"])
def test_a_malformed_messages_line_exits_2_naming_file_and_line(tmp_path, command):
    f = tmp_path / "p.jsonl"
    f.write_text('"fine"\n{"messages": [{"role": "robot", "content": "hi"}]}\n')
    r = nondet(command, "--prompts", str(f))
    assert r.returncode == 2
    assert r.stderr == (f"nondet: error: {f}:2: message 1: role must be one of system, user, assistant, "
                        "not 'robot'\n")


@pytest.mark.parametrize("flags, message", [
    (("--chat", "--system", "Be brief."), "--system is the system message of plain-text --chat prompts; every prompt "
                                          "here is {\"messages\": [...]}: put the system message in its messages"),
    (("--speculative", "ngram:2"), "a {\"messages\": [...]} prompt runs on static batches and servers; speculative "
                                   "decoding, --tp and --load continuous take plain-text prompts"),
    (("--load", "continuous"), "a {\"messages\": [...]} prompt runs on static batches and servers; speculative "
                               "decoding, --tp and --load continuous take plain-text prompts"),
])
def test_a_messages_prompt_where_it_cannot_run_is_one_line(tmp_path, flags, message):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"messages": MESSAGES}) + "\n")
    r = nondet("probe", "--prompts", str(f), *flags)
    assert r.returncode == 2
    assert r.stderr == f"nondet: error: {message}\n"
