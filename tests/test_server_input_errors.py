"""A server probe's bad inputs and bad answers end in the documented code and one line, never exit 70 or a
silent acceptance (the error audit's A1, A2, A3/B2, B8, B9, C6, C10). Each refusal has its control beside it:
the same setting or answer, well formed, goes through."""

import json
import math
import os
import re
import threading
from pathlib import Path

import pytest

import cli_runner
from stub_server import AnsweringServer
from nondet.errors import ModelLoadError, ServerResponseError, UsageError
from nondet.probes.core.load_config import LoadConfig
from nondet.probes.probe import ProbeConfig, run_probe, validate_config
from nondet.probes.server.responses import parse_completion

URL = "http://127.0.0.1:8000"
WHERE = f"{URL}/v1/completions"
PROMPT = "hi there"
PIECES = [" alpha", " beta", " gamma"]


def completion(**logprobs) -> dict:
    """A /v1/completions answer whose logprobs are the well-formed ones with `logprobs` replaced."""
    lp = {"tokens": PIECES, "token_logprobs": [-0.5, -0.25, -1.0],
          "top_logprobs": [{p: -0.5, " other": -1.5} for p in PIECES], **logprobs}
    return {"id": "c", "choices": [{"index": 0, "text": "".join(PIECES), "finish_reason": "length", "logprobs": lp}]}


def chat(content) -> dict:
    """A /v1/chat/completions answer with logprobs.content = content."""
    return {"id": "c", "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(PIECES)},
                                    "finish_reason": "length", "logprobs": {"content": content}}]}


GOOD_CHAT = [{"token": p, "logprob": -0.5, "top_logprobs": [{"token": p, "logprob": -0.5}]} for p in PIECES]


class Server(AnsweringServer):
    """A local OpenAI-compatible server: the n-th completion request for PROMPT (n = 1, 2, ... in arrival order)
    is answered `answer(n)`, the fillers well formed; every_request: every completion request is PROMPT's."""

    def __init__(self, answer, every_request: bool = False):
        self.answer, self.every_request, self.targets, self.lock = answer, every_request, 0, threading.Lock()
        super().__init__()

    def reply(self, body: dict) -> dict:
        asked = body.get("prompt") or " ".join(m.get("content", "") for m in body.get("messages", []))
        if not self.every_request and PROMPT not in str(asked):
            return chat(GOOD_CHAT) if body.get("messages") else completion()
        with self.lock:
            self.targets += 1
            n = self.targets
        return self.answer(n)


def server_config(url: str, out: Path, **load) -> ProbeConfig:
    load = {"mode": "server", "endpoint": url, "rate": 100.0, "timeout": 5.0, **load}
    return ProbeConfig(prompt=PROMPT, max_new_tokens=3, runs=2, out=str(out), load=LoadConfig(**load))


def nondet(*args):
    return cli_runner.run(args, env=dict(os.environ), timeout=300)


# -- A1: logprobs of the wrong type are a malformed answer (exit 5), not an internal error -------------------


@pytest.mark.parametrize("body, chat_api, what", [
    (completion(token_logprobs="oops"), False, "choices[0].logprobs.token_logprobs is a string, not a list"),
    (completion(top_logprobs=5), False, "choices[0].logprobs.top_logprobs is a number, not a list"),
    (completion(top_logprobs=[{}, "x", {}]), False, "choices[0].logprobs.top_logprobs[1] is a string, not an "
                                                    "object or null"),
    (completion(tokens=[" alpha", 7, " gamma"]), False, "choices[0].logprobs.tokens[1] is a number, not a string"),
    (completion(token_logprobs=[-0.5]), False, "3 tokens but 1 token_logprobs"),
    ({"choices": [{"text": "x", "logprobs": "oops"}]}, False, "choices[0].logprobs is a string, not an object"),
    (chat("oops"), True, "choices[0].logprobs.content is a string, not a list"),
    (chat(["a", "b"]), True, "choices[0].logprobs.content[0] is a string, not an object"),
    (chat([{**GOOD_CHAT[0], "top_logprobs": 3}]), True, "choices[0].logprobs.content[0].top_logprobs is a number, "
                                                        "not a list"),
    (chat([{**GOOD_CHAT[0], "top_logprobs": [None]}]), True, "choices[0].logprobs.content[0].top_logprobs[0] is "
                                                             "null, not an object"),
    (chat([{**GOOD_CHAT[0], "token": 4}]), True, "choices[0].logprobs.content[0].token is a number, not a string"),
])
def test_logprobs_of_the_wrong_type_are_a_malformed_answer(body, chat_api, what):
    with pytest.raises(ServerResponseError, match=f"^{re.escape(f'{WHERE} answered malformed logprobs ({what})')}$"):
        parse_completion(body, chat_api, WHERE)


@pytest.mark.parametrize("body, chat_api", [
    (completion(), False), (chat(GOOD_CHAT), True),
    ({"choices": [{"text": "".join(PIECES), "logprobs": {"content": GOOD_CHAT}}]}, False),  # llama-server's shape
])
def test_well_formed_logprobs_are_read(body, chat_api):
    tokens = parse_completion(body, chat_api, WHERE).tokens
    assert [t[0] for t in tokens] == PIECES and all(isinstance(t[1], float) for t in tokens)


@pytest.mark.parametrize("logprobs", [None, {}])
def test_an_answer_without_logprobs_is_still_read_as_text_only(logprobs):
    body = {"choices": [{"text": "x", "logprobs": logprobs}]}
    assert parse_completion(body, False, WHERE).tokens is None


def test_a_malformed_answer_mid_run_keeps_the_answers_already_written(tmp_path):
    """The reference answers well, the copies with a string for token_logprobs: exit 5, the one line naming
    what was wrong, the reference's stream kept for --resume."""
    with Server(lambda n: completion() if n == 1 else completion(token_logprobs="oops")) as server:
        r = nondet("probe", "--endpoint", server.url, "-p", PROMPT, "-n", "3", "--runs", "2", "--rate", "100",
                   "--out", str(tmp_path / "run"))
    run = tmp_path / "run"
    assert (r.returncode, r.stderr) == (5, f"nondet: error: {server.url}/v1/completions answered malformed logprobs "
                                           "(choices[0].logprobs.token_logprobs is a string, not a list); 1 completed "
                                           f"answers are kept in {run}: finish with `nondet probe --resume {run}`\n")
    assert [json.loads(line)["request_index"] for line in (run / "streams.jsonl").read_text().splitlines()] == [0]


def test_the_same_server_answering_well_finishes(tmp_path):
    with Server(lambda n: completion()) as server:
        result = run_probe(server_config(server.url, tmp_path / "run"))
    assert result.summary["load"]["compare_level"] == "logprobs" and server.targets == 3


def test_a_malformed_chat_answer_is_exit_5_too(tmp_path):
    with Server(lambda n: chat("oops")) as server, pytest.raises(ServerResponseError, match=re.escape(
            "/v1/chat/completions answered malformed logprobs (choices[0].logprobs.content is a string, not a list)")):
        run_probe(server_config(server.url, tmp_path / "run", chat=True))
    with Server(lambda n: chat(GOOD_CHAT)) as server:  # the control
        assert run_probe(server_config(server.url, tmp_path / "ok", chat=True)).summary["load"]["chat"] is True


# -- A2, B9: the URLs are checked with the config: exit 2 naming the flag --------------------------------------


@pytest.mark.parametrize("load, said", [
    ({"endpoint": "http://127.0.0.1:99999"}, "--endpoint 'http://127.0.0.1:99999': the port must be a number from 1 "
                                             "to 65535"),
    ({"endpoint": "http://127.0.0.1:0"}, "--endpoint 'http://127.0.0.1:0': the port must be a number from 1 to 65535"),
    ({"endpoint": "http://127.0.0.1:abc"}, "--endpoint 'http://127.0.0.1:abc': the port must be a number from 1 to "
                                           "65535"),
    ({"endpoint": "127.0.0.1:8000"}, "--endpoint must be an http(s) URL like http://127.0.0.1:8000, not "
                                     "'127.0.0.1:8000'"),
    ({"endpoint": "http://[::1"}, "--endpoint must be an http(s) URL like http://127.0.0.1:8000, not 'http://[::1'"),
    ({"endpoint": URL, "against": "http://127.0.0.1:70000"}, "--against 'http://127.0.0.1:70000': the port must be "
                                                             "a number from 1 to 65535"),
    ({"endpoint": URL, "against": "ftp://h"}, "--against must be an http(s) URL like http://127.0.0.1:8000, not "
                                              "'ftp://h'"),
])
def test_a_bad_url_is_a_usage_error_naming_its_flag(load, said):
    with pytest.raises(UsageError, match=f"^{re.escape(said)}$"):
        validate_config(ProbeConfig(load=LoadConfig(mode="server", **load)))


@pytest.mark.parametrize("against", [URL, URL + "/", URL + "/v1", URL + "/v1/", "HTTP://127.0.0.1:8000"])
def test_against_the_endpoint_deployment_itself_is_refused(against):
    said = f"--against {against} is the --endpoint deployment {URL}: it would be compared with itself; give the URL " \
           "of a second deployment"
    with pytest.raises(UsageError, match=f"^{re.escape(said)}$"):
        validate_config(ProbeConfig(load=LoadConfig(mode="server", endpoint=URL, against=against)))


@pytest.mark.parametrize("endpoint, against", [
    (URL, "http://127.0.0.1:8001"), (URL, "http://127.0.0.2:8000"), ("http://h", "https://h"),
    ("http://h/a", "http://h/b"), ("http://[::1]:8000", "http://[::1]:8001"),
])
def test_two_deployments_and_good_urls_are_accepted(endpoint, against):
    validate_config(ProbeConfig(load=LoadConfig(mode="server", endpoint=endpoint, against=against)))


def test_the_cli_refuses_a_bad_port_and_the_same_deployment_in_one_line_before_any_request(tmp_path):
    r = nondet("probe", "--endpoint", "http://127.0.0.1:99999", "-p", PROMPT, "--out", str(tmp_path / "a"))
    assert (r.returncode, r.stderr) == (2, "nondet: error: --endpoint 'http://127.0.0.1:99999': the port must be a "
                                           "number from 1 to 65535\n")
    r = nondet("probe", "--endpoint", "http://127.0.0.1:9", "--against", "http://127.0.0.1:9/", "-p", PROMPT,
               "--out", str(tmp_path / "b"))
    assert (r.returncode, r.stderr) == (2, "nondet: error: --against http://127.0.0.1:9/ is the --endpoint deployment "
                                           "http://127.0.0.1:9: it would be compared with itself; give the URL of a "
                                           "second deployment\n")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# -- A3 / B2: --timeout and --rate must be finite and > 0 ----------------------------------------------------


@pytest.mark.parametrize("load, said", [
    ({"timeout": math.nan}, "--timeout must be a number of seconds > 0, not nan"),
    ({"timeout": math.inf}, "--timeout must be a number of seconds > 0, not inf"),
    ({"timeout": 0.0}, "--timeout must be a number of seconds > 0, not 0.0"),
    ({"rate": math.nan}, "--rate must be a number > 0, not nan"),
    ({"rate": math.inf}, "--rate must be a number > 0, not inf"),
    ({"rate": -1.0}, "--rate must be a number > 0, not -1.0"),
    ({"concurrency": 0}, "--concurrency must be >= 1, not 0"),
])
def test_a_server_number_that_is_no_setting_is_a_usage_error(load, said):
    with pytest.raises(UsageError, match=f"^{re.escape(said)}$"):
        validate_config(ProbeConfig(load=LoadConfig(mode="server", endpoint=URL, **load)))
    control = {k: {"timeout": 0.5, "rate": 2.0, "concurrency": 1}[k] for k in load}
    validate_config(ProbeConfig(load=LoadConfig(mode="server", endpoint=URL, **control)))


def test_the_cli_refuses_timeout_nan_and_rate_nan_with_exit_2(tmp_path):
    for flag in ("--timeout", "--rate"):
        r = nondet("probe", "--endpoint", "http://127.0.0.1:9", "-p", PROMPT, flag, "nan", "--out", str(tmp_path))
        said = "--timeout must be a number of seconds > 0" if flag == "--timeout" else "--rate must be a number > 0"
        assert (r.returncode, r.stderr) == (2, f"nondet: error: {said}, not nan\n")


# -- B8: --resume refuses a prompt it would not send -------------------------------------------------------


RESUME_TEXT = ("--resume (the run keeps the settings it started with; --endpoint, --timeout and --api-key-env may "
               "be given anew)")


def test_resume_refuses_a_prompt_and_a_new_run_takes_it():
    resume = LoadConfig(mode="server", resume="/tmp/run")
    said = f"--prompt / --prompt-file / --prompts does not apply to {RESUME_TEXT}; drop it"
    with pytest.raises(UsageError, match=f"^{re.escape(said)}$"):
        validate_config(ProbeConfig(prompt="other", load=resume))
    validate_config(ProbeConfig(load=resume))  # the control: resume without one
    validate_config(ProbeConfig(prompt="other", load=LoadConfig(mode="server", endpoint=URL)))  # and a new run


def test_the_cli_refuses_resume_with_a_prompt_and_resumes_without_one(tmp_path):
    run = tmp_path / "run"
    with Server(lambda n: completion() if n == 1 else {"error": "down"}) as server:
        first = nondet("probe", "--endpoint", server.url, "-p", PROMPT, "-n", "3", "--runs", "2", "--rate", "100",
                       "--out", str(run))
        assert first.returncode == 5  # cut off after the reference: an unfinished run
        r = nondet("probe", "--resume", str(run), "--endpoint", server.url, "-p", "other")
        assert (r.returncode, r.stderr) == (2, f"nondet: error: --prompt / --prompt-file / --prompts does not apply "
                                               f"to {RESUME_TEXT}; drop it\n")
        r = nondet("probe", "--resume", str(run), "--endpoint", server.url, "--out", str(tmp_path / "elsewhere"))
        assert (r.returncode, r.stderr) == (2, f"nondet: error: --out does not apply to {RESUME_TEXT}; drop it\n")
        server.answer = lambda n: completion()
        r = nondet("probe", "--resume", str(run), "--endpoint", server.url, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["modes"]["default"]["n_runs"] == 3


# -- C6: nondet rl reads a server's answer as nondet probe does -----------------------------------------------


def test_rl_names_an_answer_without_choices_as_probe_does():
    from nondet.probes.rl.server import sampled

    with pytest.raises(ServerResponseError, match=f"^{re.escape(WHERE)} answered JSON without choices\\[0\\].text$"):
        sampled({"id": "x", "object": "text_completion"}, WHERE, URL)
    with pytest.raises(ServerResponseError, match="malformed logprobs"):
        sampled(completion(tokens=["token_id:1"], token_logprobs="oops"), WHERE, URL)
    with pytest.raises(ServerResponseError, match=f"^the server at {re.escape(URL)} returned no logprobs"):
        sampled({"choices": [{"text": "x", "logprobs": None}]}, WHERE, URL)  # the control: really no logprobs
    body = completion(tokens=["token_id:5", "token_id:6"], token_logprobs=[-0.5, -0.25], top_logprobs=None)
    assert sampled(body, WHERE, URL) == ([5, 6], [-0.5, -0.25])


def test_rl_cli_against_a_server_without_choices_exits_5(tiny_model_dir, tmp_path):
    with Server(lambda n: {"id": "x", "object": "text_completion"}, every_request=True) as server:
        r = nondet("rl", "--model", str(tiny_model_dir), "--endpoint", server.url, "-n", "3",
                   "--out", str(tmp_path / "run"))
    assert (r.returncode, r.stderr) == (5, f"nondet: error: {server.url}/v1/completions answered JSON without "
                                           "choices[0].text\n")


# -- C10: a --tokenizer directory that is not there --------------------------------------------------------


def test_a_missing_tokenizer_directory_is_named(tmp_path, tiny_model_dir):
    from nondet.probes.server.source import _local_tokenizer

    for name in ("/nonexistent/tok", str(tmp_path / "nope"), "./nope-tok"):
        with pytest.raises(ModelLoadError, match=f"^tokenizer directory not found: {re.escape(name)}$"):
            _local_tokenizer(name)
    assert _local_tokenizer(str(tiny_model_dir)).vocab_size > 0  # the control: the directory is there


def test_the_cli_says_the_tokenizer_directory_is_not_found_with_exit_3(tmp_path):
    with Server(lambda n: completion()) as server:
        r = nondet("probe", "--endpoint", server.url, "-p", PROMPT, "--tokenizer", "/nonexistent/tok",
                   "--out", str(tmp_path / "run"))
    assert (r.returncode, r.stderr) == (3, "nondet: error: tokenizer directory not found: /nonexistent/tok\n")
