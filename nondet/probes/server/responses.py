"""Read an OpenAI-compatible completion answer: text, finish reason, and per-token logprobs if any.

/v1/completions puts logprobs in `choices[0].logprobs` as parallel lists (`tokens`,
`token_logprobs`, `top_logprobs` dicts); /v1/chat/completions as `choices[0].logprobs.content`,
one object per token, and so does llama.cpp's server (`llama-server`) on /v1/completions too. Servers that ignore the `logprobs` field (transformers serve) return
none; then only the text is compared. Logprobs of the wrong shape (a string where a list belongs,
a number where an object does) are a malformed answer, exit 5, as an answer without a text is.
"choices[0]" here is the choice whose `index` is 0 (the request asks for one completion), wherever
it stands in the list: a server that answers several is read at that one, and none with index 0 (or
an index that is not a number) is a malformed answer too.
"""

from dataclasses import dataclass

from nondet.errors import ServerResponseError
from nondet.probes.server.compare import token_id

ITEM_NAMES = {str: "a string", dict: "an object", (dict, type(None)): "an object or null"}  # what _items wants


@dataclass
class ServerCompletion:
    text: str
    finish: str | None
    tokens: list[list] | None  # [[piece, logprob, [[piece, logprob], ...top]], ...] or None
    prompt_tokens: int | None  # usage.prompt_tokens when given
    ids: list[list] | None = None  # per token [its id, [its tops' ids]] (compare.token_id); None with tokens None


def parse_completion(body: dict, chat: bool, where: str) -> ServerCompletion:
    choice, text = _choice_text(body, chat, where)
    read = _chat_tokens(choice, where) if chat else _completion_tokens(choice, where)
    tokens, ids = ([t for t, _ in read], [i for _, i in read]) if read is not None else (None, None)
    if text is None and tokens:  # a reasoning model cut off by max_tokens: content null, every token in logprobs
        text = "".join(t[0] for t in tokens)
    if not isinstance(text, str):  # neither a text nor tokens: nothing to compare
        raise ServerResponseError(f"{where} answered a non-text completion ({type(text).__name__})")
    if tokens == [] and text:  # an empty list beside a text is a field sent empty, not a zero-token completion
        tokens = ids = None
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    return ServerCompletion(text, choice.get("finish_reason"), tokens, usage.get("prompt_tokens"), ids)


def _choice_text(body: dict, chat: bool, where: str) -> tuple[dict, object]:
    """The choice with index 0 and its text (None where a chat answer's content is null); a body without them is
    refused, naming the server's own error where it sent one (some servers answer HTTP 200 with {"error": ...})."""
    choices = body.get("choices")
    if isinstance(choices, list) and choices:
        choice = _index_zero(choices, where)
        try:
            return choice, choice["message"]["content"] if chat else choice["text"]
        except (KeyError, TypeError):
            pass
    if body.get("error"):
        raise ServerResponseError(f"{where} answered an error: {_error_message(body['error'])}")
    field = "choices[0].message.content" if chat else "choices[0].text"
    raise ServerResponseError(f"{where} answered JSON without {field}")


def _index_zero(choices: list, where: str):
    """The choice whose `index` is 0: the request asks for one completion (n left at 1), so a server that answers
    several, or lists them out of order, is read at that one; none with index 0, or an index that is no number,
    is a malformed answer. A lone choice without an `index` (some servers leave it out) is the completion."""
    if len(choices) == 1 and not (isinstance(choices[0], dict) and "index" in choices[0]):
        return choices[0]
    for k, choice in enumerate(choices):
        if not isinstance(choice, dict):
            raise _malformed(where, f"choices[{k}] is {_json_type(choice)}, not an object", "choices")
        if "index" not in choice:
            raise _malformed(where, f"choices[{k}] has no index beside {len(choices) - 1} other choices", "choices")
        if not _is_int(choice["index"]):
            raise _malformed(where, f"choices[{k}].index is {_json_type(choice['index'])}, not a number", "choices")
    zero = [choice for choice in choices if choice["index"] == 0]
    if len(zero) != 1:
        raise _malformed(where, f"{len(zero)} of {len(choices)} choices have index 0; one completion was asked for",
                         "choices")
    return zero[0]


def _error_message(error, limit: int = 200) -> str:
    """The server's error message on one line, shortened: error.message where it is an object, else the value."""
    message = (error.get("message") or error) if isinstance(error, dict) else error
    text = " ".join(str(message).split())
    return text[:limit] + "..." if len(text) > limit else text


def _completion_tokens(choice: dict, where: str) -> list | None:
    """[(token, ids), ...]; [] for a zero-token completion; None where the server sent no logprobs."""
    lp = _logprobs(choice, where)
    if lp.get("content") is not None:  # llama-server: the chat shape on /v1/completions
        return _chat_tokens(choice, where)
    if lp.get("tokens") is None or lp.get("token_logprobs") is None:
        return None
    pieces = _items(lp["tokens"], str, "choices[0].logprobs.tokens", where)
    values = _items(lp["token_logprobs"], object, "choices[0].logprobs.token_logprobs", where)
    if len(values) != len(pieces):
        raise _malformed(where, f"{len(pieces)} tokens but {len(values)} token_logprobs")
    tops = _items(lp.get("top_logprobs") or [None] * len(pieces), (dict, type(None)),
                  "choices[0].logprobs.top_logprobs", where)
    raws = _fallback_bytes(pieces, choice.get("text"))
    return [_token(piece, value, token_id(piece, raw), _top_pairs((p, v, token_id(p)) for p, v in (top or {}).items()))
            for piece, value, top, raw in zip(pieces, values, tops, raws)]


def _fallback_bytes(pieces: list[str], text) -> list[bytes | None]:
    """Each "\ufffd" piece's byte, read from the server's text: this shape has no `bytes`, and vLLM sends
    every byte-fallback token (a Llama-2 or Mistral ’ is <0xE2><0x80><0x99>) as "\ufffd", so the pieces alone
    make different tokens one. A run of such pieces gets the bytes the text holds between the pieces around
    it, one per token, only where the counts agree; anywhere the text and pieces do not line up, None (the
    piece then stands for the token, as before)."""
    raws: list[bytes | None] = [None] * len(pieces)
    if not isinstance(text, str) or "\ufffd" not in "".join(pieces):
        return raws
    at, i = 0, 0
    while i < len(pieces):
        if pieces[i] != "\ufffd":
            if not text.startswith(pieces[i], at):
                return [None] * len(pieces)
            at, i = at + len(pieces[i]), i + 1
            continue
        end = next((j for j in range(i, len(pieces)) if pieces[j] != "\ufffd"), len(pieces))
        if end < len(pieces) and not pieces[end]:  # an empty piece after the run: where the run ends is unknown
            return [None] * len(pieces)
        stop = text.find(pieces[end], at) if end < len(pieces) else len(text)
        if stop < 0:
            return [None] * len(pieces)
        run = text[at:stop].encode("utf-8", "surrogatepass")
        if len(run) == end - i:
            raws[i:end] = [run[k:k + 1] for k in range(len(run))]
        at, i = stop, end
    return raws


def _chat_tokens(choice: dict, where: str) -> list | None:
    content = _logprobs(choice, where).get("content")
    if content is None:
        return None
    field = "choices[0].logprobs.content"
    return [_chat_token(t, f"{field}[{i}]", where) for i, t in enumerate(_items(content, dict, field, where))]


def _chat_token(t: dict, field: str, where: str) -> tuple:
    """One token of the chat shape: {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}
    (llama.cpp adds "id")."""
    tops = _items(t.get("top_logprobs") or [], dict, f"{field}.top_logprobs", where)
    triples = [(_piece(e, f"{field}.top_logprobs[{i}]", where), e.get("logprob"),
                _entry_id(e, f"{field}.top_logprobs[{i}]", where)) for i, e in enumerate(tops)]
    return _token(_piece(t, field, where), t.get("logprob"), _entry_id(t, field, where), _top_pairs(triples))


def _token(piece: str, value, tid: int, tops: list) -> tuple:
    """(the token as ServerCompletion.tokens holds it, its ids as ServerCompletion.ids does)."""
    return [piece, _num(value), [[p, v] for p, v, _ in tops]], [tid, [i for _, _, i in tops]]


def _entry_id(entry: dict, field: str, where: str) -> int:
    """A chat-shape entry's identity from what the server says identifies it: see compare.token_id."""
    raw, sid = entry.get("bytes"), entry.get("id")
    if raw is not None and not (isinstance(raw, list) and all(_is_byte(b) for b in raw)):
        raise _malformed(where, f"{field}.bytes is {_json_type(raw)}, not a list of bytes")
    if sid is not None and not (isinstance(sid, int) and not isinstance(sid, bool)):
        raise _malformed(where, f"{field}.id is {_json_type(sid)}, not a number")
    return token_id(_piece(entry, field, where), None if raw is None else bytes(raw), sid)


def _is_byte(value) -> bool:
    return _is_int(value) and 0 <= value < 256


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _logprobs(choice: dict, where: str) -> dict:
    """choices[0].logprobs as an object; {} where the server sent none (null, or left it out)."""
    lp = choice.get("logprobs")
    if not lp:
        return {}
    if not isinstance(lp, dict):
        raise _malformed(where, f"choices[0].logprobs is {_json_type(lp)}, not an object")
    return lp


def _items(value, kind, field: str, where: str) -> list:
    """value when it is a list whose items are all of `kind`; else the malformed-answer error naming the field.
    A wrong type here was an internal error (exit 70) once: code that iterates a string or calls .get on one."""
    if not isinstance(value, list):
        raise _malformed(where, f"{field} is {_json_type(value)}, not a list")
    bad = next((i for i, item in enumerate(value) if not isinstance(item, kind)), None)
    if bad is not None:
        raise _malformed(where, f"{field}[{bad}] is {_json_type(value[bad])}, not {ITEM_NAMES[kind]}")
    return value


def _piece(entry: dict, field: str, where: str) -> str:
    piece = entry.get("token", "")
    if not isinstance(piece, str):
        raise _malformed(where, f"{field}.token is {_json_type(piece)}, not a string")
    return piece


def _malformed(where: str, what: str, part: str = "logprobs") -> ServerResponseError:
    return ServerResponseError(f"{where} answered malformed {part} ({what})")


def _json_type(value) -> str:
    """The JSON name of a parsed value's type, as a server's author would read it."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _top_pairs(triples) -> list[tuple]:
    """(piece, logprob, id) of the alternatives with a number for a logprob, most likely first."""
    kept = [(piece, _num(value), tid) for piece, value, tid in triples if _num(value) is not None]
    return sorted(kept, key=lambda pvi: -pvi[1])


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
