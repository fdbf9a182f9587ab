"""GitHub Actions outputs of a gate: `::error` annotations and a Markdown job summary.

Only under GitHub Actions (GITHUB_ACTIONS=true): one `::error` line per failing condition on
stdout (or one `::notice` when the policy is met), and a Markdown summary appended to the
file named by $GITHUB_STEP_SUMMARY. Model text is untrusted: workflow-command data is
%-escaped so a newline cannot start a command of its own, and Markdown cells are escaped.
"""

import os
import re
import sys
from pathlib import Path
from typing import Mapping, Sequence, TextIO

from nondet.gate.policy import Verdict

_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~])")  # emphasis, code, links, table cells


NUMBERS_NOTE = ("First numeric divergence: the first step where the sampled token's logprob bits differ from the "
                "reference. bisect's first differing step is the first where any activation differs: it can be "
                "earlier, when a difference is rounded away before it reaches the logprob.")


def emit(verdicts: Sequence[Verdict], env: Mapping[str, str] = os.environ, out: TextIO = sys.stdout,
         bisects: Sequence[str | None] = ()) -> Path | None:
    """Annotations and step summary when running under GitHub Actions; returns the summary path.
    OSError when the summary cannot be written (the annotations are printed by then)."""
    annotate(verdicts, env, out)
    return append_step_summary(verdicts, env, bisects)


def annotate(verdicts: Sequence[Verdict], env: Mapping[str, str] = os.environ, out: TextIO = sys.stdout) -> None:
    """`::error` / `::notice` lines on stdout, under GitHub Actions only."""
    if env.get("GITHUB_ACTIONS") != "true":
        return
    for line in annotations(verdicts):
        print(line, file=out)


def append_step_summary(verdicts: Sequence[Verdict], env: Mapping[str, str] = os.environ,
                        bisects: Sequence[str | None] = ()) -> Path | None:
    """Append the Markdown summary to $GITHUB_STEP_SUMMARY under GitHub Actions; OSError if it cannot."""
    target = env.get("GITHUB_STEP_SUMMARY")
    if env.get("GITHUB_ACTIONS") != "true" or not target:
        return None
    with open(target, "a", encoding="utf-8") as f:
        f.write(step_summary(verdicts, bisects))
    return Path(target)


def annotations(verdicts: Sequence[Verdict]) -> list[str]:
    lines = []
    for verdict in verdicts:
        suffix = f" [{verdict.name}]" if verdict.name else ""
        for c in verdict.failures:
            title = f"nondet gate: {c.condition_id}{suffix}"
            lines.append(f"::error title={_property(title)}::{_data(f'{verdict.policy.describe()}: {c.message}')}")
        if verdict.passed:
            lines.append(f"::notice title={_property('nondet gate' + suffix)}::{_data(verdict.message)}")
    return lines


def step_summary(verdicts: Sequence[Verdict], bisects: Sequence[str | None] = ()) -> str:
    """Markdown: one heading for the whole gate, one table (and bisect line) per gated prompt."""
    passed = all(v.passed for v in verdicts)
    policies = ", ".join(dict.fromkeys(v.policy.describe() for v in verdicts))
    head = "✅ policy met" if passed else "❌ policy violated"
    parts = [f"## nondet gate: {head} ({md(policies)})\n"]
    bisects = list(bisects) + [None] * (len(verdicts) - len(bisects))
    parts += [_verdict_section(v, b) for v, b in zip(verdicts, bisects)]
    parts.append(f"_{md(NUMBERS_NOTE)}_")
    return "\n".join(parts) + "\n"


def md(text: str) -> str:
    """Text safe inside a Markdown table cell: HTML and Markdown syntax escaped, one line."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = " ".join(text.splitlines())
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def _verdict_section(verdict: Verdict, bisect: str | None = None) -> str:
    lines = []
    if verdict.name:
        lines.append(f"**{md(verdict.name)}**\n")
    lines.append(md(verdict.message) + "\n")
    lines.append("| condition | runs | first token divergence | first numeric divergence | result |")
    lines.append("| --- | ---: | ---: | ---: | --- |")
    for c in verdict.conditions:
        result = "✅ pass" if c.passed else f"❌ {md(c.message)}"
        lines.append(f"| {md(c.condition_id)} | {c.n_runs} | {_step(c.first_token_divergence)} "
                     f"| {_step(c.first_numeric_divergence)} | {result} |")
    if bisect:
        lines.append(f"\nbisect: {md(bisect)}")
    if verdict.run_dir:
        lines.append(f"\nrun directory: {md(verdict.run_dir)}")
    return "\n".join(lines) + "\n"


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def _step(value: int | None) -> str:
    return "–" if value is None else str(value)
