"""Pure-Python parts of the load probes: arrival schedules, answer parsing, comparison levels."""

import pytest

from nondet.errors import ServerResponseError, UsageError
from nondet.probes.core import arrivals
from nondet.probes.server import compare
from nondet.probes.server.client import Client, ClientSettings, public_headers
from nondet.probes.core.load_config import LoadConfig, validate
from nondet.probes.server.responses import parse_completion


def test_schedules_are_seeded_and_bounded():
    a = arrivals.per_step(arrivals.run_rng(0, 1), 0.5, 24, 16, 50)
    assert a == arrivals.per_step(arrivals.run_rng(0, 1), 0.5, 24, 16, 50)
    assert a != arrivals.per_step(arrivals.run_rng(0, 2), 0.5, 24, 16, 50)
    assert len(a) == 24 and all(0 <= x.filler < 16 and 1 <= x.max_new_tokens <= 100 for x in a)
    assert [x.at for x in a] == sorted(x.at for x in a)
    s = arrivals.per_second(arrivals.run_rng(0, 0), 4.0, 400, 3, 8)
    assert 80 < s[-1].at < 120  # 400 arrivals at 4 per second: about 100 s


def test_poisson_mean():
    rng = arrivals.run_rng(1, 1)
    draws = [arrivals.poisson(rng, 0.5) for _ in range(4000)]
    assert 0.45 < sum(draws) / len(draws) < 0.55


def test_completion_logprobs_parse_to_exact_steps():
    body = {"choices": [{"text": " a b", "finish_reason": "length", "logprobs": {
        "tokens": [" a", " b"], "token_logprobs": [-0.25, -1.5],
        "top_logprobs": [{" a": -0.25, " c": -2.0}, {" b": -1.5}]}}], "usage": {"prompt_tokens": 7}}
    c = parse_completion(body, chat=False, where="u")
    assert c.text == " a b" and c.prompt_tokens == 7 and compare.level_of(c.tokens, None) == "logprobs"
    steps = compare.steps_at("logprobs", c.text, c.tokens, None)
    assert [s["piece"] for s in steps] == [" a", " b"]
    assert steps[0]["logprob"] == (-0.25).hex() and steps[0]["margin"] == (1.75).hex()
    assert steps[1]["margin"] is None and steps[0]["token"] == compare.piece_id(" a")


def test_chat_logprobs_and_token_ids():
    body = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop", "logprobs": {"content": [
        {"token": "token_id:42", "logprob": -0.1, "top_logprobs": [{"token": "token_id:42", "logprob": -0.1},
                                                                   {"token": "token_id:7", "logprob": -3.0}]}]}}]}
    c = parse_completion(body, chat=True, where="u")
    step = compare.steps_at("logprobs", c.text, c.tokens, None)[0]
    assert step["token"] == 42 and step["top"][1][0] == 7


def test_text_level_is_word_by_word():
    steps = compare.steps_at("text", "Queens, New York", None, None)
    assert [s["piece"] for s in steps] == ["Queens,", " New", " York"]
    assert all(s["logprob"] is None for s in steps)
    assert compare.lowest(["logprobs", "text", "tokenizer"]) == "text"


@pytest.mark.parametrize("body", [{}, {"choices": []}, {"choices": [{"message": {}}]}, {"choices": [{"text": 3}]}])
def test_answer_without_text_is_a_response_error(body):
    with pytest.raises(ServerResponseError):
        parse_completion(body, chat=False, where="http://x/v1/completions")


def test_settings_validation_and_headers():
    with pytest.raises(UsageError, match="greedy"):
        validate(LoadConfig(mode="continuous"), temperature=0.7)
    with pytest.raises(UsageError, match="--endpoint"):
        validate(LoadConfig(mode="server"), temperature=0.0)
    with pytest.raises(UsageError, match="http"):
        Client(ClientSettings("127.0.0.1:8000"))
    assert Client(ClientSettings("http://h:1/v1")).url("/v1/models") == "http://h:1/v1/models"
    assert public_headers({"server": "vllm", "set-cookie": "s", "date": "d"}) == {"server": "vllm"}
