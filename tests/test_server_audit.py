"""Three live-server defects, each beside its control: the prefix axis against a server that reports no usage
(its four cached lengths stay four rows), a choice read by its `index` rather than its place in the list, and
--timeout bounding a whole request (a server that trickles its answer a byte at a time still times out)."""

import time
from http.server import BaseHTTPRequestHandler

import pytest

import cli_runner
from stub_server import AnsweringServer, LocalServer, StubServer, completion_body
from nondet.errors import ServerResponseError, ServerUnreachableError
from nondet.fmt import fmt_prefill_form, prefill_order
from nondet.probes.core.load_config import LoadConfig
from nondet.probes.probe import ProbeConfig, run_probe
from nondet.probes.server.client import Client, ClientSettings
from nondet.probes.server.responses import parse_completion

PROMPT = "Tell me about Richard Feynman, his childhood in Far Rockaway and his years at Los Alamos"
WHERE = "http://127.0.0.1:8000/v1/completions"
NO_USAGE = "the server reported no usage.prompt_tokens"


# -- 1: the prefix axis without usage ---------------------------------------------------------------------------


class NoUsage(AnsweringServer):
    """The stub's completion, without `usage` (some servers leave it out)."""

    def reply(self, body: dict):
        answer = completion_body(1, body)
        del answer["usage"]
        return answer


def prefix_probe(url, out):
    return run_probe(ProbeConfig(prompt=PROMPT, max_new_tokens=4, prefill=("prefix:auto",), out=str(out),
                                 load=LoadConfig(mode="server", endpoint=url, timeout=5.0))).summary


def test_without_usage_the_four_fractions_stay_four_rows_in_order(tmp_path):
    with NoUsage() as server:
        summary = prefix_probe(server.url, tmp_path / "r")
    forms = summary["prefill"]["by_form"]
    assert [fmt_prefill_form(f) for f in sorted(forms, key=prefill_order)] == [
        "prefix 25% cached", "prefix 50% cached", "prefix 75% cached", "prefix all cached"]
    assert all(f["n_prompts"] == 1 for f in forms)
    assert any(note.startswith(f"prefix cache: {NO_USAGE}") for note in summary["load"]["notes"])
    done = cli_runner.run(["report", str(tmp_path / "r")])
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "r" / "report.md").read_text()
    at = [text.index(f"prefix {size} cached") for size in ("25%", "50%", "75%", "all")]
    assert at == sorted(at)
    assert "Prefix cache: " + NO_USAGE in text  # the load's notes are in the report, as on the terminal


def test_with_usage_the_rows_are_token_counts_as_before(tmp_path):
    with StubServer() as stub:  # usage.prompt_tokens = the warming prompt's words
        summary = prefix_probe(stub.url, tmp_path / "r")
    sizes = [f["size"] for f in summary["prefill"]["by_form"]]
    assert len(sizes) == 4 and all(isinstance(s, int) and s > 0 for s in sizes) and sizes == sorted(sizes)
    assert not any(NO_USAGE in note for note in summary["load"]["notes"])
    assert cli_runner.run(["report", str(tmp_path / "r")]).returncode == 0
    text = (tmp_path / "r" / "report.md").read_text()
    assert "Prefix cache: cold by" in text and NO_USAGE not in text  # control: the note only where it holds


# -- 2: the choice with index 0 ---------------------------------------------------------------------------------


def choice(index, text: str) -> dict:
    return {**({} if index is None else {"index": index}), "text": text, "finish_reason": "length"}


def test_the_choice_with_index_0_is_read_wherever_it_stands():
    body = {"choices": [choice(1, " wrong"), choice(0, " right")]}
    assert parse_completion(body, False, WHERE).text == " right"
    chat = {"choices": [{"index": 1, "message": {"content": " wrong"}}, {"index": 0, "message": {"content": " right"}}]}
    assert parse_completion(chat, True, WHERE).text == " right"


@pytest.mark.parametrize("choices", [[choice(0, " one")], [choice(None, " one")]])
def test_a_lone_choice_at_index_0_or_without_an_index_is_read(choices):
    assert parse_completion({"choices": choices}, False, WHERE).text == " one"


@pytest.mark.parametrize("choices, what", [
    ([choice(1, " one")], "0 of 1 choices have index 0; one completion was asked for"),
    ([choice(1, " a"), choice(2, " b")], "0 of 2 choices have index 0; one completion was asked for"),
    ([choice(0, " a"), choice(0, " b")], "2 of 2 choices have index 0; one completion was asked for"),
    ([choice(0, " a"), choice(None, " b")], "choices[1] has no index beside 1 other choices"),
    ([choice("0", " a")], "choices[0].index is a string, not a number"),
    ([choice(True, " a")], "choices[0].index is a boolean, not a number"),
    ([choice(0, " a"), "b"], "choices[1] is a string, not an object"),
])
def test_no_single_choice_with_index_0_is_a_malformed_answer(choices, what):
    with pytest.raises(ServerResponseError) as caught:
        parse_completion({"choices": choices}, False, WHERE)
    assert str(caught.value) == f"{WHERE} answered malformed choices ({what})"


def test_a_body_without_choices_says_so_as_before():
    for body in ({"id": "x"}, {"choices": []}, {"choices": "x"}, {"choices": ["x"]}, {"choices": [{"index": 0}]}):
        with pytest.raises(ServerResponseError, match=rf"^{WHERE} answered JSON without choices\[0\]\.text$"):
            parse_completion(body, False, WHERE)


class Indexed(AnsweringServer):
    """The stub's completion, its one choice numbered `index`."""

    def __init__(self, index: int):
        self.index = index
        super().__init__()

    def reply(self, body: dict):
        answer = completion_body(1, body)
        answer["choices"][0]["index"] = self.index
        return answer


@pytest.mark.parametrize("index, code", [(0, 0), (3, 5)])
def test_the_cli_refuses_a_choice_not_at_index_0_in_one_line(tmp_path, index, code):
    with Indexed(index) as server:
        done = cli_runner.run(["probe", "--endpoint", server.url, "-p", "hi there", "-n", "2", "--runs", "1",
                               "--out", str(tmp_path / "r")])
    assert done.returncode == code, done.stderr
    if code:
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert "answered malformed choices (0 of 1 choices have index 0" in done.stderr


# -- 3: --timeout bounds the whole request ----------------------------------------------------------------------

BODY = b'{"trickled": true}'  # 18 bytes: a byte every 0.3 s takes 5.4 s


def trickling(slow: int, gap: float = 0.3, head: bool = False):
    """A handler that answers BODY, its first `slow` bytes `gap` seconds apart (with head, the status line and
    headers first, a byte at a time too), the rest at once."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            status = f"HTTP/1.0 200 OK\r\nContent-Length: {len(BODY)}\r\n\r\n".encode()
            try:
                if not head:
                    self.wfile.write(status)
                for byte in (status if head else b"") + BODY[:slow]:
                    self.wfile.write(bytes([byte]))
                    time.sleep(gap)
                self.wfile.write(BODY[slow:])
            except OSError:  # the client gave up and closed the connection
                pass

    return Handler


def post(url: str, timeout: float = 1.0):
    return Client(ClientSettings(url, timeout=timeout, retries=2, backoff=0.05)).post("/v1/completions", {"p": 1})


@pytest.mark.parametrize("head", [False, True])
def test_a_trickling_answer_times_out_at_the_timeout(head):
    with LocalServer(trickling(len(BODY), head=head)) as server:
        started = time.monotonic()
        with pytest.raises(ServerUnreachableError) as caught:
            post(server.url)
        took = time.monotonic() - started
    # one attempt (a timeout is not resent), ended well before the trickle's 5.4 s (a per-read timeout would wait
    # for all of it); the upper bound leaves room for a loaded CI host
    assert 0.9 < took < 4.0
    said = str(caught.value)
    assert said.endswith("no answer within 1 s; the server hangs or is overloaded (--timeout)") and "\n" not in said


def test_the_same_server_answering_within_the_timeout_is_read():
    with LocalServer(trickling(2)) as server:
        started = time.monotonic()
        reply = post(server.url)
    assert reply.body == {"trickled": True} and reply.attempts == 1 and time.monotonic() - started > 0.5


def test_prefill_order_sorts_token_counts_and_text_shares_together():
    """A server that reports usage for some warming requests only: counts first, then shares; no TypeError."""
    from nondet.fmt import prefill_order

    rows = [{"kind": "prefix", "size": "all"}, {"kind": "prefix", "size": 12}, {"kind": "chunk", "size": 4},
            {"kind": "prefix", "size": "25%"}, {"kind": "prefix", "size": 3}]
    assert [r["size"] for r in sorted(rows, key=prefill_order)] == [3, 12, "25%", "all", 4]
    with pytest.raises(TypeError):  # control: the plain (kind, size) key cannot order the mix
        sorted(rows, key=lambda r: (r["kind"] != "prefix", r["size"]))
