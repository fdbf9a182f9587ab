"""The prompts a run sent, from config.json: plain text in one row, a chat one row per turn.

A chat is a {"messages": [...]} prompt, or plain text under `probe --chat` (sent as the user's turn
after `--system`, when given). Turns are model-side text: escaped by every renderer (blocks.Model).
A long turn is shown as its start and end around an ellipsis, with its length.
"""

from nondet.fmt import DASH
from nondet.reports.blocks import Model, Para, Table


def prompt_blocks(config: dict) -> list:
    """config.json's "config" (ProbeConfig or RLConfig fields) -> a table of its prompts, or a hint."""
    prompts = config.get("prompts") or ([config["prompt"]] if config.get("prompt") else [])
    if not prompts:
        return [Para(["No recorded prompt (config.json is missing or holds none)."], kind="hint")]
    rows = [[f"p{k}" if i == 0 else "", role, shortened(text)]
            for k, prompt in enumerate(prompts)
            for i, (role, text) in enumerate(_turns(prompt, config.get("chat", False), config.get("system")))]
    return [Table(["prompt", "role", "text"], rows)]


HEAD, TAIL = 300, 100  # characters kept of a long prompt: a table cell stays readable; config.json has it all


def shortened(text: str) -> "Model | list":
    """Model text as it is, or its first and last characters around an ellipsis, with its length."""
    if len(text) <= HEAD + TAIL + 40:  # cutting fewer characters than the note takes gains nothing
        return Model(text)
    return [Model(text[:HEAD]), " … ", Model(text[-TAIL:]), f" ({len(text):,} characters)"]


def _turns(prompt, chat: bool, system: str | None) -> list[tuple[str, str]]:
    """(role, text) as sent: a chat's turns, or the plain text (role "—")."""
    if isinstance(prompt, dict):
        return [(m["role"], m["content"]) for m in prompt["messages"]]
    if chat:
        return [*([("system", system)] if system else []), ("user", prompt)]
    return [(DASH, prompt)]
