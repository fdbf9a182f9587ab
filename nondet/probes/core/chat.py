"""Chat formatting of a prompt, as a server formats /v1/chat/completions: the tokenizer's chat template
rendered with the assistant's turn opened.

Two prompts are chat-formatted: a Chat (a {"messages": [...]} line of a prompt file, nondet/prompt.py),
always, with its messages as written; and plain text under `probe --chat`, as one user turn after
an optional system message. In process the rendered text (a TemplatedText) is tokenized without special
tokens (the template holds them), which gives the ids `apply_chat_template(..., tokenize=True)` gives:
what transformers serve feeds the model for the same messages. Plain text is tokenized as the
tokenizer's default call does, with the BOS token where the tokenizer adds one (Llama-3, Gemma,
Mistral): what `tokenizer(prompt)`, a pipeline and a server's /v1/completions feed the model. A server
probe sends `chat_messages` as they are.
"""

from nondet.errors import UsageError
from nondet.probes.core.child_process import one_line
from nondet.prompt import Chat, Prompt, as_prompt


def chat_messages(prompt: Prompt, system: str | None = None) -> list[dict]:
    """A Chat's messages as written; plain text as the user's turn, after a system message when given."""
    if isinstance(prompt, Chat):
        return prompt.as_messages()
    system_turn = [{"role": "system", "content": system}] if system else []
    return [*system_turn, {"role": "user", "content": prompt}]


def chat_text(tokenizer, prompt: Prompt, system: str | None = None) -> str:
    """The prompt through the tokenizer's chat template; a one-line error when it has none."""
    if not getattr(tokenizer, "chat_template", None):
        if isinstance(prompt, Chat):
            raise UsageError("a {\"messages\": [...]} prompt is sent through the model's chat template, and its "
                             "tokenizer has none; give the prompt as plain text")
        raise UsageError("--chat: the model's tokenizer has no chat template; drop --chat to send raw text")
    try:
        text = tokenizer.apply_chat_template(chat_messages(prompt, system), tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - the template is the model's code (jinja2's TemplateError and
        # what its raise_exception raises: Gemma's "System role not supported", Mistral's alternating roles)
        raise UsageError(f"the model's chat template refused these messages: {one_line(exc, 200)}"
                         f"{'; drop --system' if system and 'system' in str(exc).lower() else ''}") from exc
    return TemplatedText(text)


class TemplatedText(str):
    """A prompt rendered by the chat template: it holds its special tokens, so none are added to it."""


def prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of one prompt as the model reads it: a TemplatedText as rendered, plain text with the special
    tokens the tokenizer's default call adds (a BOS), as `tokenizer(prompt)` gives."""
    return tokenizer(text, add_special_tokens=not isinstance(text, TemplatedText))["input_ids"]


def model_text(tokenizer, prompt, chat: bool = False, system: str | None = None) -> str:
    """One prompt as the model reads it: a Chat (or its config.json form) always chat-formatted, plain
    text chat-formatted under `chat` (probe --chat), else as given."""
    prompt = as_prompt(prompt)
    return chat_text(tokenizer, prompt, system) if chat or isinstance(prompt, Chat) else prompt


def model_texts(tokenizer, prompts, chat: bool, system: str | None = None) -> list[str]:
    """The prompts as the model reads them (model_text). The probe and bisect's replay, which reads
    them from config.json, both build their batches from this."""
    return [model_text(tokenizer, p, chat, system) for p in prompts]


def prompt_token_ids(tokenizer, prompt: Prompt) -> list[int]:
    """The token ids nondet rl samples from: a Chat through the chat template, plain text as it is (prompt_ids)."""
    return prompt_ids(tokenizer, model_text(tokenizer, prompt))
