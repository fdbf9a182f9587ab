"""Chat formatting of a prompt, as a server formats /v1/chat/completions: the tokenizer's chat template
with an optional system message, rendered with the assistant's turn opened.

In process (`probe --chat`) the rendered text is tokenized without special tokens (the template holds
them), which gives the ids `apply_chat_template(..., tokenize=True)` gives: what transformers serve
feeds the model for the same messages. A server probe sends `chat_messages` as they are.
"""

from nondet.errors import UsageError


def chat_messages(prompt: str, system: str | None = None) -> list[dict]:
    """The user's prompt (after a system message, when given) as chat messages."""
    system_turn = [{"role": "system", "content": system}] if system else []
    return [*system_turn, {"role": "user", "content": prompt}]


def chat_text(tokenizer, prompt: str, system: str | None = None) -> str:
    """The prompt through the tokenizer's chat template; a one-line error when it has none."""
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError("--chat: the model's tokenizer has no chat template; drop --chat to send raw text")
    return tokenizer.apply_chat_template(chat_messages(prompt, system), tokenize=False, add_generation_prompt=True)


def model_texts(tokenizer, prompts, chat: bool, system: str | None = None) -> list[str]:
    """The prompts as the model reads them: chat-formatted when `chat` (probe --chat), else as given.
    The probe and bisect's replay both build their batches from this."""
    return [chat_text(tokenizer, p, system) for p in prompts] if chat else list(prompts)
