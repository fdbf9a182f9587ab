"""A chat prompt reaches the model as the same token ids in process (`nondet probe`) and through
`transformers serve`'s /v1/chat/completions (`nondet probe --endpoint`): a {"messages": [...]} line
of a prompt file, and a plain-text prompt under --chat --system.

transformers serve returns no token ids and no logprobs for a chat completion, only
usage.prompt_tokens and the text. So, per prompt:
- the ids, exactly: the server's own steps for a request's messages (its handler's
  get_processor_inputs_from_messages for the modality it detects, then apply_chat_template as the
  handler calls it) give the ids the in-process probe feeds the model (model_texts -> tokenize_inputs);
- the live server's prompt_tokens equal the in-process probe's prompt_tokens;
- its greedy completion (temperature 0, batch size 1, the same bf16 weights on this CPU) is the
  in-process one, character for character. A random model's greedy text depends on every prompt
  token, so other ids of the same count would not give it (the negative control below shows the
  text moving when only the system message differs).
Negative control: in process under another system message, the count and the text differ from
the server's; so do the ids, so the exact check can fail too.
"""

import json

import pytest
from serve_fixtures import transformers_serve
import cli_runner

MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Why is the sky blue?\nOne sentence."}]
PLAIN, SYSTEM = "Tell me about Richard Feynman.\nBriefly.", "You are a physicist."
TOKENS = 12


def nondet(*args) -> None:
    r = cli_runner.run(args, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


def references(run) -> dict[int, dict]:
    """prompt_id -> the reference stream (the prompt alone) of a run directory."""
    streams = [json.loads(line) for line in (run / "streams.jsonl").read_text().splitlines()]
    return {s["prompt_id"]: s for s in streams if s["is_reference"]}


def served_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The ids transformers serve feeds the model for a /v1/chat/completions request's messages."""
    from transformers.cli.serving.chat_completion import ChatCompletionHandler
    from transformers.cli.serving.model_manager import ModelManager

    modality = ModelManager.get_model_modality(None, processor=tokenizer)
    inputs = tokenizer.apply_chat_template(ChatCompletionHandler.get_processor_inputs_from_messages(messages, modality),
                                           add_generation_prompt=True, return_dict=True, tokenize=True)
    return list(inputs["input_ids"])


def in_process_ids(tokenizer, prompt, system: str | None) -> list[int]:
    """The ids `nondet probe --chat [--system]` builds for a prompt's batch (StaticSource.open)."""
    from nondet.probes.core.batch import tokenize_inputs
    from nondet.probes.core.chat import model_texts
    from nondet.prompt import as_prompt

    [text] = model_texts(tokenizer, [as_prompt(prompt)], True, system)
    return tokenize_inputs(tokenizer, text, ())[0]


@pytest.mark.slow
def test_in_process_chat_and_a_served_model_get_the_same_ids(tmp_path, tiny_chat_model_dir):
    from transformers import AutoTokenizer

    model = str(tiny_chat_model_dir)
    chat_file, plain_file = tmp_path / "chat.jsonl", tmp_path / "plain.jsonl"
    chat_file.write_text(json.dumps({"messages": MESSAGES}) + "\n")
    plain_file.write_text(json.dumps({"messages": MESSAGES}) + "\n" + json.dumps(PLAIN) + "\n")
    served_flags = ("--runs", "1", "--filler-requests", "0", "-n", str(TOKENS), "--tokenizer", model)
    with transformers_serve(tiny_chat_model_dir, tmp_path / "serve", continuous=False) as url:
        nondet("probe", "--endpoint", url, "--prompts", str(chat_file), *served_flags, "--out", str(tmp_path / "s0"))
        nondet("probe", "--endpoint", url, "--prompt", PLAIN, "--chat", "--system", SYSTEM, *served_flags,
               "--out", str(tmp_path / "s1"))
    # in process, one file: the messages line as written, the plain line as a --chat turn after --system
    nondet("probe", "--model", model, "--prompts", str(plain_file), "--chat", "--system", SYSTEM, "-b", "1",
           "-n", str(TOKENS), "--out", str(tmp_path / "local"))
    nondet("probe", "--model", model, "--prompt", PLAIN, "--chat", "--system", "You are a poet.", "-b", "1",
           "-n", str(TOKENS), "--out", str(tmp_path / "other"))

    tokenizer = AutoTokenizer.from_pretrained(model)
    local, other = references(tmp_path / "local"), references(tmp_path / "other")[0]
    served = [references(tmp_path / name)[0] for name in ("s0", "s1")]
    plain_messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PLAIN}]
    for k, (prompt, system, messages) in enumerate([({"messages": MESSAGES}, None, MESSAGES),
                                                    (PLAIN, SYSTEM, plain_messages)]):
        ids = in_process_ids(tokenizer, prompt, system)
        assert ids == served_ids(tokenizer, messages)
        assert local[k]["prompt_tokens"] == served[k]["prompt_tokens"] == len(ids)
        assert len(local[k]["steps"]) == TOKENS and local[k]["text"] == served[k]["text"]
    # negative control: another system message in process: other ids, count and text than the server's
    assert in_process_ids(tokenizer, PLAIN, "You are a poet.") != served_ids(tokenizer, plain_messages)
    assert other["prompt_tokens"] != served[1]["prompt_tokens"] and other["text"] != served[1]["text"]
