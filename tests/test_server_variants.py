"""Valid server answers of less common shapes are read as what they are (audit 2: D1, D2, D3, D4, D7), each
beside its control: byte-fallback tokens told apart by their bytes or ids, a zero-token completion, a reasoning
model's null content, a 429 with Retry-After, an HTTP 200 error body."""

import threading
import time
from pathlib import Path

import pytest

from stub_server import AnsweringServer
from nondet.errors import ServerResponseError
from nondet.probes.core.load_config import LoadConfig
from nondet.probes.probe import ProbeConfig, run_probe
from nondet.probes.server import client as client_module
from nondet.probes.server.client import Client, ClientSettings
from nondet.probes.server.responses import parse_completion

PROMPT = "hi there"
WHERE = "http://127.0.0.1:8000/v1/completions"
R = "\ufffd"
PIECES = ["It", R, R, R, "s"]
RIGHT, LEFT = "It\u2019s", "It\u201cs"  # ’ = E2 80 99, “ = E2 80 9C: they differ at the third byte token
WORDS = [" alpha", " beta", " gamma"]


def chat(pieces, text, raws=None, ids=None, values=None) -> dict:
    content = [{"token": p, "logprob": v, **({"bytes": raws[i]} if raws else {}), **({"id": ids[i]} if ids else {}),
                "top_logprobs": [{"token": p, "logprob": v}]}
               for i, (p, v) in enumerate(zip(pieces, values or [-0.5] * len(pieces)))]
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length",
                         "logprobs": {"content": content}}]}


def completion(pieces, text, values=None) -> dict:
    values = values or [-0.5] * len(pieces)
    lp = {"tokens": pieces, "token_logprobs": values, "top_logprobs": [{p: v} for p, v in zip(pieces, values)]}
    return {"choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": lp}]}


def bytes_of(last: int) -> list:
    return [list(b"It"), [0xE2], [0x80], [last], list(b"s")]


class Server(AnsweringServer):
    """The n-th completion request for PROMPT (n = 1 the reference, 2... the copies) is answered answer(n): a body,
    or (status, headers, body); fillers get answer(1)."""

    def __init__(self, answer):
        self.answer, self.targets, self.times, self.lock = answer, 0, [], threading.Lock()
        super().__init__()

    def reply(self, body: dict):
        asked = body.get("prompt") or " ".join(m.get("content", "") for m in body.get("messages", []))
        with self.lock:
            self.times.append(time.monotonic())
            if PROMPT not in str(asked):
                return self.answer(1)
            self.targets += 1
            return self.answer(self.targets)


def probe(url: str, out: Path, chat_api: bool = False, runs: int = 3) -> dict:
    load = LoadConfig(mode="server", endpoint=url, rate=100.0, timeout=10.0, chat=chat_api, filler_requests=0)
    return run_probe(ProbeConfig(prompt=PROMPT, max_new_tokens=5, runs=runs, out=str(out), load=load)).summary


def mode(summary: dict) -> dict:
    return summary["modes"]["default"]


# -- D1: a token's identity is what the server says identifies it ---------------------------------------------


def test_byte_tokens_with_different_bytes_are_different_tokens(tmp_path):
    with Server(lambda n: chat(PIECES, LEFT if n == 3 else RIGHT, bytes_of(0x9C if n == 3 else 0x99))) as server:
        m = mode(probe(server.url, tmp_path / "run", chat_api=True))
    assert (m["distinct_completions"], m["first_token_divergence"]) == (2, 3)


def test_byte_tokens_with_the_same_bytes_are_one_token(tmp_path):
    with Server(lambda n: chat(PIECES, RIGHT, bytes_of(0x99))) as server:
        m = mode(probe(server.url, tmp_path / "run", chat_api=True))
    assert (m["distinct_completions"], m["first_token_divergence"]) == (1, None)


def ids_of(answer: dict, chat_api: bool) -> list[int]:
    c = parse_completion(answer, chat_api, WHERE)
    return [tid for tid, _ in c.ids]


def test_ids_tell_byte_tokens_apart_only_where_the_piece_cannot():
    a = ids_of(chat(PIECES, RIGHT, ids=[1, 2, 3, 4, 5]), True)
    b = ids_of(chat(PIECES, RIGHT, ids=[1, 2, 3, 9, 5]), True)
    assert a[3] != b[3] and a[:3] == b[:3]
    # the control: readable pieces keep their piece's id whatever id is sent (ids are per tokenizer, pieces are not)
    assert ids_of(chat(WORDS, "", ids=[7, 8, 9]), True) == ids_of(chat(WORDS, ""), True) == ids_of(
        completion(WORDS, "".join(WORDS)), False)


def test_bytes_that_spell_the_piece_give_the_pieces_id_and_token_id_labels_their_number():
    assert ids_of(chat(WORDS, "", raws=[list(w.encode()) for w in WORDS]), True) == ids_of(chat(WORDS, ""), True)
    assert ids_of(chat(["token_id:5"], "", raws=[list(b"token_id:5")]), True) == [5]


def test_the_completions_shape_reads_byte_tokens_from_the_text():
    right, left = ids_of(completion(PIECES, RIGHT), False), ids_of(completion(PIECES, LEFT), False)
    assert right[:3] == left[:3] and right[3] != left[3]
    assert right == ids_of(chat(PIECES, RIGHT, bytes_of(0x99)), True)  # the same ids as the bytes would give
    # the control: a text that does not line up with the pieces leaves the pieces' ids
    assert ids_of(completion(PIECES, "other"), False)[1:4] == ids_of(chat(PIECES, ""), True)[1:4]


def test_malformed_bytes_are_a_malformed_answer():
    with pytest.raises(ServerResponseError, match=r"content\[0\]\.bytes is a string, not a list of bytes"):
        parse_completion(chat(["a"], "a", raws=["x"]), True, WHERE)
    assert parse_completion(chat(["a"], "a", raws=[None]), True, WHERE).tokens[0][0] == "a"  # null bytes: allowed


# -- D2: a zero-token completion is at the logprobs level --------------------------------------------------


@pytest.mark.parametrize("chat_api", [False, True])
def test_an_empty_completion_keeps_the_logprobs_level(tmp_path, chat_api):
    def answer(n):
        values = [-0.5, -0.25 if n == 2 else -0.5, -0.5]
        if n == 4:
            return chat([], "") if chat_api else completion([], "")
        return chat(WORDS, "".join(WORDS), values=values) if chat_api else completion(WORDS, "".join(WORDS), values)

    with Server(answer) as server:
        summary = probe(server.url, tmp_path / "run", chat_api=chat_api)
    m = mode(summary)
    assert summary["load"]["compare_level"] == "logprobs" and "no logprobs" not in " ".join(summary["load"]["notes"])
    # copies arrive in any order: which run got which answer varies, the set of divergences does not
    got = sorted((str(r["first_token_divergence"]), str(r["first_numeric_divergence"])) for r in m["runs"])
    assert got == [("0", "0"), ("None", "1"), ("None", "None"), ("None", "None")]


def test_an_empty_token_list_beside_a_text_is_no_logprobs():
    """The control: a server that sends the field empty with a text did not send logprobs."""
    assert parse_completion(completion([], "x"), False, WHERE).tokens is None
    assert parse_completion(chat([], "x"), True, WHERE).tokens is None
    assert parse_completion(completion([], ""), False, WHERE).tokens == []


# -- D3: a chat answer with null content but logprobs ----------------------------------------------------------


def test_null_content_with_logprobs_is_read_from_the_tokens():
    c = parse_completion(chat(WORDS, None), True, WHERE)
    assert (c.text, [t[0] for t in c.tokens]) == ("".join(WORDS), WORDS)


def test_null_content_without_logprobs_is_refused():
    body = {"choices": [{"index": 0, "message": {"content": None}, "logprobs": None}]}
    with pytest.raises(ServerResponseError, match=r"answered a non-text completion \(NoneType\)$"):
        parse_completion(body, True, WHERE)
    with pytest.raises(ServerResponseError, match=r"answered a non-text completion \(NoneType\)$"):
        parse_completion(chat([], None), True, WHERE)


def test_a_probe_of_a_reasoning_model_cut_off_finishes(tmp_path):
    with Server(lambda n: chat(WORDS, None)) as server:
        m = mode(probe(server.url, tmp_path / "run", chat_api=True))
    assert m["distinct_completions"] == 1


# -- D4: HTTP 429 with Retry-After -----------------------------------------------------------------------------


def limited(header: dict):
    """A server that answers the first request 429 (with `header`), then well."""
    def answer(n):
        return (429, header, {"error": {"message": "rate limited"}}) if n == 1 else completion(WORDS, "".join(WORDS))
    return answer


def post(url: str, retries: int = 2) -> object:
    client = Client(ClientSettings(url, timeout=10.0, retries=retries, backoff=0.05))
    return client.post("/v1/completions", {"prompt": PROMPT})


def test_retry_after_is_waited_then_the_answer_is_read():
    with Server(limited({"Retry-After": "1"})) as server:
        reply = post(server.url)
    gap = server.times[1] - server.times[0]
    assert reply.attempts == 2 and 0.95 <= gap < 3


def test_without_retry_after_the_backoff_applies():
    with Server(limited({})) as server:
        reply = post(server.url)
    assert reply.attempts == 2 and server.times[1] - server.times[0] < 0.5


def test_retry_after_is_capped_and_the_error_says_how_long_it_waited(monkeypatch):
    monkeypatch.setattr(client_module, "MAX_RETRY_AFTER", 0.5)
    with Server(lambda n: (429, {"Retry-After": "120"}, {"error": {"message": "slow down"}})) as server:
        with pytest.raises(ServerResponseError) as caught:
            post(server.url)
    said = str(caught.value)
    assert "\n" not in said and "answered HTTP 429" in said
    assert "(3 attempts, 1 s waited as its Retry-After asked)" in said
    assert server.times[-1] - server.times[0] < 3


# -- D7: an HTTP 200 error body --------------------------------------------------------------------------------


def test_an_error_body_names_the_servers_message():
    long = "This model's maximum context length is 4096 tokens.\n" + "x" * 500
    with pytest.raises(ServerResponseError) as caught:
        parse_completion({"error": {"message": long, "type": "invalid_request_error"}}, False, WHERE)
    said = str(caught.value)
    assert said.startswith(f"{WHERE} answered an error: This model's maximum context length is 4096 tokens. xxx")
    assert "\n" not in said and said.endswith("...") and len(said) < 300
    with pytest.raises(ServerResponseError, match=f"^{WHERE} answered an error: not found$"):
        parse_completion({"error": "not found"}, False, WHERE)


def test_a_body_without_choices_or_error_says_so_as_before():
    with pytest.raises(ServerResponseError, match=rf"^{WHERE} answered JSON without choices\[0\]\.text$"):
        parse_completion({"id": "x"}, False, WHERE)


def test_the_cli_shows_the_servers_error_in_one_line(tmp_path):
    import cli_runner
    import os

    with Server(lambda n: {"error": {"message": "maximum context length is 4096 tokens"}}) as server:
        r = cli_runner.run(("probe", "--endpoint", server.url, "-p", PROMPT, "-n", "3", "--runs", "1",
                            "--out", str(tmp_path / "run")), env=dict(os.environ), timeout=300)
    assert r.returncode == 5 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "answered an error: maximum context length is 4096 tokens" in r.stderr
