"""One prompt-file format for every command (probe, rl and gate --prompts, gate's prompts-file, the pytest plugin).

A file is JSONL when its first non-blank line starts with `{` or `"`: each non-blank line is then
a JSON string or {"prompt": "..."} (plain text, so a prompt may hold newlines: code prompts), or
{"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}: a chat (a
nondet.prompt.Chat). Any other file is plain text, one prompt a line.

A messages line is always sent as chat turns, as written: in process through the tokenizer's chat
template with the assistant's turn opened (the ids a server's /v1/chat/completions feeds the model),
to a server as /v1/chat/completions. In a file that mixes both, plain lines stay plain text; `probe
--chat` makes each of them one user turn, after `--system` when given. `--system` never touches a
messages line (its own system message, or none, is what is sent), so `--system` with messages
lines only is refused. No torch.
"""

import json
from pathlib import Path

from nondet.errors import UsageError
from nondet.prompt import Prompt, chat_of

LINE_FORMS = 'a JSON string, {"prompt": "..."} or {"messages": [...]}'


def is_jsonl(lines: list[str]) -> bool:
    first = next((ln.lstrip() for ln in lines if ln.strip()), "")
    return first.startswith(("{", '"'))


def read_prompt_file(path: Path | str, what: str = "prompts") -> tuple[Prompt, ...]:
    """The prompts of a file (JSONL or plain lines), or a one-line UsageError naming file:line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {what} file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if is_jsonl(lines):
        prompts = [_json_prompt(line, f"{path}:{n}") for n, line in enumerate(lines, 1) if line.strip()]
    else:
        prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise UsageError(f"{what} file {path} has no prompts")
    return tuple(prompts)


def _json_prompt(line: str, where: str) -> Prompt:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not valid JSON ({exc.msg}); a line is {LINE_FORMS}") from None
    if isinstance(data, dict) and "messages" in data:
        if "prompt" in data:
            raise UsageError(f"{where}: give \"prompt\" or \"messages\", not both")
        return chat_of(data["messages"], where)
    text = data.get("prompt") if isinstance(data, dict) else data
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{where}: expected {LINE_FORMS} with non-empty text")
    return text
