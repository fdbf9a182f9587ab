"""One prompt-file format for every command (probe, rl and gate --prompts, gate's prompts-file, the pytest plugin).

A file is JSONL when its first non-blank line starts with `{` or `"`: each non-blank line is then
a JSON string or {"prompt": "..."}, so a prompt may hold newlines (code prompts). Any other file
is plain text, one prompt a line. {"messages": [...]} lines (chat) are recognised and refused in
one line until in-process chat formatting exists: a chat prompt must be sent with the tokens a
server would give it, never silently as text. No torch.
"""

import json
from pathlib import Path

from nondet.errors import UsageError


def is_jsonl(lines: list[str]) -> bool:
    first = next((ln.lstrip() for ln in lines if ln.strip()), "")
    return first.startswith(("{", '"'))


def read_prompt_file(path: Path | str, what: str = "prompts") -> tuple[str, ...]:
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


def _json_prompt(line: str, where: str) -> str:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not valid JSON ({exc.msg}); a line is a JSON string or "
                         "{\"prompt\": \"...\"}") from None
    if isinstance(data, dict) and "messages" in data:
        raise UsageError(f"{where}: chat messages are not supported in prompt files yet; give the "
                         "formatted prompt as {\"prompt\": \"...\"}")
    text = data.get("prompt") if isinstance(data, dict) else data
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{where}: expected a JSON string or {{\"prompt\": \"...\"}} with non-empty text")
    return text
