"""Read an OpenAI-compatible completion answer: text, finish reason, and per-token logprobs if any.

/v1/completions puts logprobs in `choices[0].logprobs` as parallel lists (`tokens`,
`token_logprobs`, `top_logprobs` dicts); /v1/chat/completions as `choices[0].logprobs.content`,
one object per token, and so does llama.cpp's server (`llama-server`) on /v1/completions too. Servers that ignore the `logprobs` field (transformers serve) return
none; then only the text is compared. Logprobs of the wrong shape (a string where a list belongs,
a number where an object does) are a malformed answer, exit 5, as an answer without a text is.
"""

from dataclasses import dataclass

from nondet.errors import ServerResponseError

ITEM_NAMES = {str: "a string", dict: "an object", (dict, type(None)): "an object or null"}  # what _items wants


@dataclass
class ServerCompletion:
    text: str
    finish: str | None
    tokens: list[list] | None  # [[piece, logprob, [[piece, logprob], ...top]], ...] or None
    prompt_tokens: int | None  # usage.prompt_tokens when given


def parse_completion(body: dict, chat: bool, where: str) -> ServerCompletion:
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
    except (KeyError, IndexError, TypeError):
        field = "choices[0].message.content" if chat else "choices[0].text"
        raise ServerResponseError(f"{where} answered JSON without {field}") from None
    if not isinstance(text, str):
        raise ServerResponseError(f"{where} answered a non-text completion ({type(text).__name__})")
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    tokens = _chat_tokens(choice, where) if chat else _completion_tokens(choice, where)
    return ServerCompletion(text, choice.get("finish_reason"), tokens, usage.get("prompt_tokens"))


def _completion_tokens(choice: dict, where: str) -> list[list] | None:
    lp = _logprobs(choice, where)
    if lp.get("content"):  # llama-server: the chat shape on /v1/completions
        return _chat_tokens(choice, where)
    if not lp.get("tokens") or not lp.get("token_logprobs"):
        return None
    pieces = _items(lp["tokens"], str, "choices[0].logprobs.tokens", where)
    values = _items(lp["token_logprobs"], object, "choices[0].logprobs.token_logprobs", where)
    if len(values) != len(pieces):
        raise _malformed(where, f"{len(pieces)} tokens but {len(values)} token_logprobs")
    tops = _items(lp.get("top_logprobs") or [None] * len(pieces), (dict, type(None)),
                  "choices[0].logprobs.top_logprobs", where)
    return [[piece, _num(value), _top_pairs((top or {}).items())] for piece, value, top in zip(pieces, values, tops)]


def _chat_tokens(choice: dict, where: str) -> list[list] | None:
    content = _logprobs(choice, where).get("content")
    if not content:
        return None
    field = "choices[0].logprobs.content"
    return [_chat_token(t, f"{field}[{i}]", where) for i, t in enumerate(_items(content, dict, field, where))]


def _chat_token(t: dict, field: str, where: str) -> list:
    """One token of the chat shape: {"token", "logprob", "top_logprobs": [{"token", "logprob"}, ...]}."""
    tops = _items(t.get("top_logprobs") or [], dict, f"{field}.top_logprobs", where)
    pairs = [(_piece(e, f"{field}.top_logprobs[{i}]", where), e.get("logprob")) for i, e in enumerate(tops)]
    return [_piece(t, field, where), _num(t.get("logprob")), _top_pairs(pairs)]


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


def _malformed(where: str, what: str) -> ServerResponseError:
    return ServerResponseError(f"{where} answered malformed logprobs ({what})")


def _json_type(value) -> str:
    """The JSON name of a parsed value's type, as a server's author would read it."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _top_pairs(pairs) -> list[list]:
    kept = [[piece, _num(value)] for piece, value in pairs if _num(value) is not None]
    return sorted(kept, key=lambda pv: -pv[1])


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
