"""A tiny local OpenAI-compatible stub, for FAULT paths only (real numerics come from a real server).

Modes (settable while running): "ok" answers every completion; "500" answers HTTP 500;
"garbage" answers 200 with a body that is not JSON; "hang" holds the request without an
answer (until `hang_seconds` pass or the stub stops); "drop" closes the connection without
an answer; "truncated" announces a 500-byte body, sends 26 bytes and closes; "nologprobs"
answers like "ok" without logprobs (as `transformers serve` does). `drop_after=K` switches to "drop" once K completions have been answered (the
server dying mid-run). Answers are deterministic: text and logprobs depend on nothing but the
stub's settings: `words` (the completion's tokens) and `logprobs` (their values), so two stubs
started with different settings stand for two deployments that differ (`--against` tests).
`engine="llama.cpp"` answers as llama.cpp's server does: `Server: llama.cpp`, models owned by
"llamacpp", a `system_fingerprint`, and /v1/completions' logprobs in the chat shape
(`logprobs.content`, one object per token).
"""

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


WORDS = (" alpha", " beta", " gamma", " delta")


@dataclass(frozen=True)
class Answer:
    words: tuple[str, ...] = WORDS  # the completion's tokens, at most max_tokens of them
    logprobs: tuple[float, ...] = (-0.5,) * len(WORDS)  # each token's logprob (JSON numbers, exact)


class LocalServer:
    """An HTTP server on 127.0.0.1 and a free port, serving from a daemon thread while entered."""

    def __init__(self, handler_class) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class AnsweringServer(LocalServer):
    """A one-off OpenAI-compatible server for a test: /v1/models lists "stub-model", and each POST is answered
    `reply(body)`, a JSON body (200) or (status, headers, body). Subclasses define reply."""

    def __init__(self) -> None:
        super().__init__(_answering_handler(self))

    def reply(self, body: dict):
        raise NotImplementedError


def _answering_handler(server: AnsweringServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            send_json(self, {"object": "list", "data": [{"id": "stub-model"}]})

        def do_POST(self) -> None:
            answer = server.reply(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            if isinstance(answer, tuple):
                send_json(self, answer[2], *answer[:2])
            else:
                send_json(self, answer)

    return Handler


class StubServer(LocalServer):
    def __init__(self, mode: str = "ok", drop_after: int | None = None, hang_seconds: float = 10.0,
                 fail_first: int = 0, answer: Answer = Answer(), engine: str | None = None,
                 answered_model: str = "stub-model"):
        self.mode, self.drop_after, self.hang_seconds, self.fail_first = mode, drop_after, hang_seconds, fail_first
        self.answer, self.engine = answer, engine
        self.answered_model = answered_model  # the "model" of each answer (/v1/models lists "stub-model")
        self.answered = 0  # completions answered with 200
        self.received: list[dict] = []  # completion request bodies, in arrival order
        self.resets: list[int] = []  # llama.cpp slot erases: how many completions had arrived before each
        self.auth: list[str | None] = []  # Authorization header of each completion request
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        super().__init__(_handler(self))

    def __exit__(self, *exc) -> None:
        self.stopping.set()  # a held ("hang") request lets go before the server shuts down
        super().__exit__(*exc)

    def decide(self, body: dict) -> str:
        """What to do with one completion request."""
        with self.lock:
            self.received.append(body)
            if self.fail_first > 0:
                self.fail_first -= 1
                return "500"
            if self.drop_after is not None and self.answered >= self.drop_after:
                return "drop"
            if self.mode in ("ok", "nologprobs"):
                self.answered += 1
                return f"{self.mode}:{self.answered}"
            return self.mode


def completion_body(n: int, body: dict, answer: Answer = Answer()) -> dict:
    count = max(1, min(len(answer.words), int(body.get("max_tokens", 4))))
    words, values = list(answer.words[:count]), list(answer.logprobs[:count])
    logprobs = {"tokens": words, "token_logprobs": values,
                "top_logprobs": [{w: v, " other": -1.25} for w, v in zip(words, values)]}
    return {"id": f"stub-{n}", "object": "text_completion", "model": "stub-model",
            "choices": [{"index": 0, "text": "".join(words), "finish_reason": "length", "logprobs": logprobs}],
            "usage": {"prompt_tokens": 3, "completion_tokens": len(words), "total_tokens": 3 + len(words)}}


def words_as_prompt_tokens(answer: dict, body: dict) -> dict:
    """usage.prompt_tokens = the prompt's words (the prefix probe reads a warming request's length there)."""
    n = max(1, len(str(body.get("prompt", "")).split()))
    answer["usage"].update(prompt_tokens=n, total_tokens=n + answer["usage"]["completion_tokens"])
    return answer


def as_llama_cpp(answer: dict) -> dict:
    """An answer of completion_body as llama.cpp's server words it: logprobs in the chat shape."""
    lp = answer["choices"][0]["logprobs"]
    content = [{"id": i, "token": w, "logprob": v, "top_logprobs": [{"token": t, "logprob": x} for t, x in top.items()]}
               for i, (w, v, top) in enumerate(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]))]
    answer["choices"][0]["logprobs"] = {"content": content}
    return {**answer, "system_fingerprint": "b0-stub"}


def _handler(stub: StubServer):
    class Handler(BaseHTTPRequestHandler):
        server_version = "nondet-stub/1.0"

        def version_string(self) -> str:
            return "llama.cpp" if stub.engine == "llama.cpp" else super().version_string()

        def log_message(self, *args) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                model = {"id": "stub-model", **({"owned_by": "llamacpp"} if stub.engine == "llama.cpp" else {})}
                return self._send(200, json.dumps({"object": "list", "data": [model]}).encode())
            if self.path == "/health":
                return self._send(200, b'{"status": "ok"}')
            self._send(404, b'{"error": "not found"}')

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path.startswith("/slots/"):  # llama.cpp's slot erase: its prefix cache reset
                if stub.engine != "llama.cpp":
                    return self._send(404, b'{"error": "not found"}')
                stub.resets.append(len(stub.received))  # completions received before this reset
                return self._send(200, b'{"id_slot": 0, "n_erased": 0}')
            stub.auth.append(self.headers.get("Authorization"))
            action = stub.decide(body)
            if action.startswith(("ok:", "nologprobs:")):
                kind, n = action.split(":")
                answer = {**words_as_prompt_tokens(completion_body(int(n), body, stub.answer), body),
                          "model": stub.answered_model}
                if stub.engine == "llama.cpp":
                    answer = as_llama_cpp(answer)
                if kind == "nologprobs":
                    answer["choices"][0]["logprobs"] = None
                return self._send(200, json.dumps(answer).encode(), {"x-request-id": f"stub-{n}"})
            if action == "500":
                return self._send(500, b"Internal Server Error")
            if action == "garbage":
                return self._send(200, b"<html>not json{")
            if action == "truncated":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "500")
                self.end_headers()
                self.wfile.write(b'{"id": "stub", "choices": ')  # 26 of the 500 bytes announced
                self.wfile.flush()
                return self.close_connection_now()
            if action == "hang":
                stub.stopping.wait(stub.hang_seconds)
                return self.close_connection_now()
            self.close_connection_now()

        def close_connection_now(self) -> None:
            self.close_connection = True
            self.connection.close()

        def _send(self, status: int, payload: bytes, headers: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(payload)

    return Handler


def send_json(handler: BaseHTTPRequestHandler, obj, status: int = 200, headers: dict | None = None) -> None:
    """An answer of `obj` as JSON (status and extra headers as given), for the tests' own one-off servers."""
    raw = json.dumps(obj).encode()
    handler.send_response(status)
    for k, v in {"Content-Type": "application/json", "Content-Length": str(len(raw)), **(headers or {})}.items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(raw)
