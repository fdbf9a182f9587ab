"""A prompt is plain text (`str`) or a chat conversation (`Chat`): the two forms a prompt file holds.

A Chat is always sent as chat turns: in process through the tokenizer's chat template with the
assistant's turn opened (probes/core/chat.py), to a server as the messages of /v1/chat/completions.
Plain text is sent as it is, or as one user turn under `probe --chat`. In config.json and in a
prompt file a Chat is {"messages": [{"role": "user", "content": "..."}, ...]}. No torch.
"""

import json
from dataclasses import dataclass

from nondet.errors import UsageError

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Message:
    role: str  # one of ROLES
    content: str  # the turn's text, newlines and all


@dataclass(frozen=True)
class Chat:
    messages: tuple[Message, ...]  # in order; at least one

    def as_messages(self) -> list[dict]:
        """The OpenAI form: [{"role": ..., "content": ...}, ...]."""
        return [{"role": m.role, "content": m.content} for m in self.messages]


Prompt = str | Chat


def chat_of(messages, where: str) -> Chat:
    """A Chat from the OpenAI form, or a one-line UsageError starting with `where` (file:line)."""
    if not isinstance(messages, list) or not messages:
        raise UsageError(f"{where}: \"messages\" must be a non-empty list of {{\"role\": ..., \"content\": ...}}")
    return Chat(tuple(_message(m, f"{where}: message {i}") for i, m in enumerate(messages, 1)))


def _message(data, where: str) -> Message:
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected {{\"role\": ..., \"content\": ...}}, not {json.dumps(data)[:60]}")
    if set(data) != {"role", "content"}:
        raise UsageError(f"{where}: expected the keys role and content, not {', '.join(sorted(data)) or 'none'}")
    if data["role"] not in ROLES:
        raise UsageError(f"{where}: role must be one of {', '.join(ROLES)}, not {data['role']!r}")
    if not isinstance(data["content"], str) or not data["content"].strip():
        raise UsageError(f"{where}: content must be non-empty text")
    return Message(data["role"], data["content"])


def as_prompt(value) -> Prompt:
    """A prompt as ProbeConfig and RLConfig hold it: text, a Chat, or a Chat's config.json form."""
    if isinstance(value, dict):
        return chat_of(value.get("messages"), "config.json prompt")
    return value


def is_chat(prompt: Prompt) -> bool:
    return isinstance(prompt, Chat)


def label(prompt: Prompt) -> str:
    """The prompt as one text to show: plain text as it is, a Chat as "role: content" turns."""
    if isinstance(prompt, Chat):
        return "\n".join(f"{m.role}: {m.content}" for m in prompt.messages)
    return prompt


def record(prompt: Prompt) -> dict:
    """A prompt in summary.json: {"prompt": its label} and, for a Chat, its "messages"."""
    return {"prompt": label(prompt), **({"messages": prompt.as_messages()} if isinstance(prompt, Chat) else {})}
