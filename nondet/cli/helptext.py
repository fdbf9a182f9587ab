"""Command help that reflows: a docstring's hard-wrapped prose joined into one line per paragraph.

rich reflows help text to the terminal's width but keeps every newline, so a docstring wrapped
at 100 columns broke mid-sentence on a narrower terminal. Prose lines of a paragraph are joined;
example and table lines ("Example:  nondet probe ...", "0  policy met", indented or bulleted lines)
keep their own line.
"""

import inspect


def _structured(line: str) -> bool:
    """A line that must stay a line of its own: an example or a table row (two spaces inside, as in
    "Example:  nondet probe" or "0  policy met"), an indented line, or a bullet."""
    return "  " in line.strip() or line.startswith((" ", "- ", "* ", "|"))


def reflowable(doc: str | None) -> str | None:
    """The docstring with each prose paragraph on one line (blank lines and example lines kept)."""
    if not doc:
        return doc
    out: list[str] = []
    for line in inspect.cleandoc(doc).splitlines():
        joinable = out and out[-1] and line.strip() and not _structured(line) and not _structured(out[-1])
        if joinable:
            out[-1] = f"{out[-1]} {line.strip()}"
        else:
            out.append(line)
    return "\n".join(out)


def reflow_commands(app) -> None:
    """Give every command of `app` (and of its sub-apps) reflowable help."""
    for info in app.registered_commands:
        info.help = reflowable(info.help or inspect.getdoc(info.callback))
    for group in app.registered_groups:
        reflow_commands(group.typer_instance)
