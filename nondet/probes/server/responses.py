"""Read an OpenAI-compatible completion answer: text, finish reason, and per-token logprobs if any.

/v1/completions puts logprobs in `choices[0].logprobs` as parallel lists (`tokens`,
`token_logprobs`, `top_logprobs` dicts); /v1/chat/completions as `choices[0].logprobs.content`,
one object per token, and so does llama.cpp's server (`llama-server`) on /v1/completions too. Servers that ignore the `logprobs` field (transformers serve) return
none; then only the text is compared.
"""

from dataclasses import dataclass

from nondet.errors import ServerResponseError


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
    tokens = _chat_tokens(choice) if chat else _completion_tokens(choice)
    return ServerCompletion(text, choice.get("finish_reason"), tokens, usage.get("prompt_tokens"))


def _completion_tokens(choice: dict) -> list[list] | None:
    lp = choice.get("logprobs")
    if isinstance(lp, dict) and lp.get("content"):  # llama-server: the chat shape on /v1/completions
        return _chat_tokens(choice)
    if not isinstance(lp, dict) or not lp.get("tokens") or not lp.get("token_logprobs"):
        return None
    tops = lp.get("top_logprobs") or [None] * len(lp["tokens"])
    return [[piece, _num(value), _top_pairs((top or {}).items())]
            for piece, value, top in zip(lp["tokens"], lp["token_logprobs"], tops)]


def _chat_tokens(choice: dict) -> list[list] | None:
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not content:
        return None
    return [[t.get("token", ""), _num(t.get("logprob")),
             _top_pairs((e.get("token", ""), e.get("logprob")) for e in t.get("top_logprobs") or [])]
            for t in content]


def _top_pairs(pairs) -> list[list]:
    kept = [[piece, _num(value)] for piece, value in pairs if _num(value) is not None]
    return sorted(kept, key=lambda pv: -pv[1])


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
