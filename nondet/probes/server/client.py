"""A small OpenAI-compatible HTTP client on the standard library: bounded retries, one-line errors.

Connection errors, HTTP 429 and 5xx are retried (a greedy completion has no side effects, so
sending it again is safe) with exponential backoff, a bounded number of times; where a 429 or 5xx
says `Retry-After: SECONDS`, the wait is that long instead (at most MAX_RETRY_AFTER or --timeout):
a rate limiter answers 429 again to a client that comes back sooner. A timeout is
not: the server may still be working on the request, and a resend only adds to its load.
Other 4xx answers and malformed JSON are not retried either. --timeout bounds a request as a whole
(connecting, sending, and reading the status line, headers and full body), not each socket read: a
server that trickles its answer a byte at a time fails when the time is up, as one that hangs does.
Every failure ends as one line:
ServerUnreachableError (exit 3) when the server could not be reached or did not answer in
time, ServerResponseError (exit 5) when it answered with an error, garbage or a truncated body.

The API key is read from the environment variable named by `api_key_env` when the client is
created, kept in memory only, and never appears in messages, headers returned or records.
"""

import functools
import http.client
import io
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable

from nondet.errors import ServerResponseError, ServerUnreachableError
from nondet.probes.core.endpoint import parse_endpoint

MAX_RETRY_AFTER = 30.0  # seconds: the longest Retry-After honoured; a longer one is waited this long
DROP_HEADERS = {"date", "content-length", "content-type", "connection", "set-cookie", "x-request-id",
                "transfer-encoding", "www-authenticate", "authorization"}


@dataclass(frozen=True)
class ClientSettings:
    endpoint: str  # base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)
    # seconds for one whole request: connect, send, and read the full answer; a deadline, not a per-read socket
    # timeout, so a server that hangs or trickles its answer a byte at a time fails after this
    timeout: float = 600.0
    retries: int = 2  # extra attempts after a retryable failure
    backoff: float = 0.5  # first wait between attempts; doubles each time
    api_key_env: str = "OPENAI_API_KEY"


@dataclass
class Reply:
    body: dict
    headers: dict[str, str]  # lower-case names
    seconds: float  # wall time of the successful attempt
    attempts: int


class _Retryable(Exception):
    def __init__(self, kind: str, detail: str, retry_after: float | None = None):
        super().__init__(detail)
        self.kind = kind  # "connection" | "timeout" | "status" | "truncated"
        self.retry_after = retry_after  # seconds the server asked to wait (Retry-After), None if it did not


class Client:
    def __init__(self, settings: ClientSettings, on_failed_attempt: Callable[[str], None] | None = None):
        self.settings = settings
        self.on_failed_attempt = on_failed_attempt or (lambda _detail: None)
        parts = parse_endpoint(settings.endpoint)  # a UsageError for a bad URL (checked with the config too)
        self._scheme, self._host, self._port, self._base = parts.scheme, parts.host, parts.port, parts.base
        self._key = os.environ.get(settings.api_key_env) or None

    def url(self, path: str) -> str:
        return f"{self.settings.endpoint.rstrip('/').removesuffix('/v1')}{path}"

    def get(self, path: str) -> Reply:
        return self._request("GET", path, None)

    def post(self, path: str, payload: dict) -> Reply:
        return self._request("POST", path, payload)

    def _request(self, method: str, path: str, payload: dict | None) -> Reply:
        attempts, waited = self.settings.retries + 1, 0.0
        for attempt in range(1, attempts + 1):
            try:
                return self._once(method, path, payload, attempt)
            except _Retryable as failure:
                self.on_failed_attempt(str(failure))
                if attempt == attempts or failure.kind == "timeout":
                    raise self._final_error(path, failure, attempts, waited) from None
                pause = self._pause(failure, attempt)
                time.sleep(pause)
                waited += pause if failure.retry_after is not None else 0.0
        raise AssertionError("unreachable")

    def _pause(self, failure: _Retryable, attempt: int) -> float:
        """The server's Retry-After where it gave one (capped: a probe should not sit idle for minutes, and the
        attempts stay bounded; never below the backoff, so "Retry-After: 0" is no busy loop), else the backoff."""
        backoff = self.settings.backoff * 2 ** (attempt - 1)
        if failure.retry_after is None:
            return backoff
        return max(backoff, min(failure.retry_after, MAX_RETRY_AFTER, self.settings.timeout))

    def _once(self, method: str, path: str, payload: dict | None, attempt: int) -> Reply:
        started = time.perf_counter()
        try:
            status, headers, raw = self._exchange(method, path, payload)
        except (TimeoutError, socket.timeout):
            raise _Retryable("timeout", f"no answer within {self.settings.timeout:g} s") from None
        except http.client.IncompleteRead as exc:  # it answered, then closed mid-body
            got = len(exc.partial)
            raise _Retryable("truncated", f"{got} of {got + (exc.expected or 0)} bytes") from None
        except (OSError, http.client.HTTPException) as exc:
            raise _Retryable("connection", _describe(exc)) from None
        if status == 429 or status >= 500:
            raise _Retryable("status", f"HTTP {status}: {_snippet(raw)}", _retry_after(headers))
        if status >= 400:
            raise ServerResponseError(f"{self.url(path)} answered HTTP {status}: {_snippet(raw)}{self._key_hint(status)}")
        return Reply(self._json(path, raw), headers, time.perf_counter() - started, attempt)

    def _exchange(self, method: str, path: str, payload: dict | None) -> tuple[int, dict, bytes]:
        """(status, headers, body) of one request, all of it by a deadline settings.timeout away: connecting waits
        that long at most, sending what was left after it, and each read of the answer what is left then
        (TimeoutError once nothing is)."""
        deadline = time.monotonic() + self.settings.timeout
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.settings.timeout)
        conn.response_class = functools.partial(_DeadlineResponse, deadline=deadline)
        try:
            body = None if payload is None else json.dumps(payload).encode()
            conn.connect()
            conn.sock.settimeout(_left(deadline))
            conn.request(method, self._base + path, body=body, headers=self._headers(body is not None))
            response = conn.getresponse()
            raw = response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, raw
        finally:
            conn.close()

    def _headers(self, has_body: bool) -> dict:
        headers = {"Accept": "application/json", "User-Agent": "nondet"}
        if has_body:
            headers["Content-Type"] = "application/json"
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    def _json(self, path: str, raw: bytes) -> dict:
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ServerResponseError(f"{self.url(path)} answered malformed JSON ({exc}): {_snippet(raw)}") from None
        if not isinstance(body, dict):
            raise ServerResponseError(f"{self.url(path)} answered JSON that is not an object: {_snippet(raw)}")
        return body

    def _key_hint(self, status: int) -> str:
        if status not in (401, 403):
            return ""
        state = "is not set" if self._key is None else "was sent"
        return f" (the API key from ${self.settings.api_key_env} {state}; --api-key-env names the variable)"

    def _final_error(self, path: str, failure: _Retryable, attempts: int, waited: float = 0.0) -> Exception:
        attempts = 1 if failure.kind == "timeout" else attempts
        where, tries = self.url(path), f"{attempts} attempt{'s' if attempts > 1 else ''}"
        if waited:  # so a reader knows the server's Retry-After was honoured, and for how long
            tries += f", {waited:g} s waited as its Retry-After asked"
        if failure.kind == "status":
            return ServerResponseError(f"{where} answered {failure} ({tries})")
        if failure.kind == "truncated":
            return ServerResponseError(f"{where} sent a truncated response ({failure}, then closed the "
                                       f"connection; {tries})")
        if failure.kind == "timeout":
            return ServerUnreachableError(f"{where}: {failure}; the server hangs or is overloaded (--timeout)")
        return ServerUnreachableError(f"cannot reach {where}: {failure} ({tries}); is the server running?")


class _DeadlineResponse(http.client.HTTPResponse):
    """http.client's response, its status line, headers and body read through a _DeadlineReader."""

    def __init__(self, sock, *args, deadline: float, **kwargs):
        super().__init__(sock, *args, **kwargs)
        # the socket's file HTTPResponse made, nothing read from it yet; kept, as it holds the socket open after
        # http.client closes the connection early (an answer that ends the connection)
        self.fp = io.BufferedReader(_DeadlineReader(self.fp.detach(), sock, deadline))


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, each receive waiting only for what is left until the deadline: a per-read timeout alone
    lets a server that sends a byte every few seconds hold the request forever."""

    def __init__(self, raw, sock, deadline: float):
        self._raw, self._sock, self._deadline = raw, sock, deadline  # raw: the socket's own file (socket.SocketIO)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int | None:
        self._sock.settimeout(_left(self._deadline))
        return self._raw.readinto(buffer)

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


def _left(deadline: float) -> float:
    """Seconds until the deadline (time.monotonic); TimeoutError, as a socket's, once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the request's deadline passed")
    return left


def public_headers(headers: dict[str, str]) -> dict[str, str]:
    """Response headers worth keeping as server identity (never cookies or auth)."""
    return {k: v for k, v in sorted(headers.items()) if k not in DROP_HEADERS}


def _describe(exc: Exception) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
        return "connection dropped before a complete answer"
    if isinstance(exc, socket.gaierror):
        return "host name not found"
    return (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).strip()


def _retry_after(headers: dict[str, str]) -> float | None:
    """Retry-After in its seconds form; None where absent or an HTTP date (then the usual backoff applies)."""
    value = headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds < float("inf") else None


def _snippet(raw: bytes, limit: int = 200) -> str:
    text = " ".join(raw.decode("utf-8", "replace").split())
    return (text[:limit] + "...") if len(text) > limit else (text or "(empty body)")
