"""JUnit XML of a gate: one testsuite per gated prompt, one testcase per condition.

A failing testcase's message is the condition's first divergence and branch tokens. Model
text is untrusted: ElementTree escapes markup, and characters XML 1.0 cannot hold at all
(control characters, lone surrogates) are written as \\xNN / \\uNNNN escapes first.
"""

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Sequence

from nondet.errors import UsageError
from nondet.gate.policy import ConditionResult, Verdict
from nondet.rundir.writer import unwritable

# Everything outside XML 1.0's Char production.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: str) -> str:
    """text with every character XML 1.0 cannot hold replaced by a visible escape."""
    return _NOT_XML.sub(lambda m: _escape_char(m.group()), text)


def _escape_char(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def junit_xml(verdicts: Sequence[Verdict], seconds: float = 0.0) -> str:
    root = ET.Element("testsuites", _attrs(name="nondet gate", tests=_count(verdicts),
                                           failures=sum(len(v.failures) for v in verdicts),
                                           time=f"{seconds:.3f}"))
    for verdict in verdicts:
        root.append(_suite(verdict))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def check_junit_path(path: str | Path) -> None:
    """UsageError now, before the gate runs, unless `path` can be written as a file: the JUnit file is written
    after every probe, and a path that cannot take it would turn the verdict into an internal error."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"--junit {path} is a directory; pass a file path such as {path / 'junit.xml'}")
    existing = next(p for p in path.parents if p.exists())  # write_junit makes the folders below it
    if not existing.is_dir():
        raise UsageError(f"--junit {path} lies under {existing}, which is not a directory; pass another path")
    if unwritable(existing) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"--junit {path}: permission denied; pass another path")


def write_junit(path: str | Path, verdicts: Sequence[Verdict], seconds: float = 0.0) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(junit_xml(verdicts, seconds), encoding="utf-8")
    return path


def _suite(verdict: Verdict) -> ET.Element:
    name = "nondet gate" + (f": {verdict.name}" if verdict.name else "")
    suite = ET.Element("testsuite", _attrs(name=name, tests=len(verdict.conditions),
                                           failures=len(verdict.failures), errors=0, skipped=0))
    props = ET.SubElement(suite, "properties")
    for key, value in (("policy", verdict.policy.describe()), ("run_dir", verdict.run_dir)):
        ET.SubElement(props, "property", _attrs(name=key, value=value))
    for result in verdict.conditions:
        suite.append(_case(result, verdict))
    return suite


def _case(result: ConditionResult, verdict: Verdict) -> ET.Element:
    axis = "" if verdict.policy.axis == "batch" else f"{verdict.policy.axis}."
    case = ET.Element("testcase", _attrs(classname=f"nondet.gate.{axis}{result.kernels}", name=result.condition_id))
    if not result.passed:
        failure = ET.SubElement(case, "failure", _attrs(message=result.message, type="BatchVariance"))
        failure.text = xml_safe(_details(result, verdict))
    return case


def _details(result: ConditionResult, verdict: Verdict) -> str:
    if verdict.policy.axis == "rl":
        return _rl_details(result, verdict)
    lines = [
        f"condition: {result.condition_id} ({result.n_runs} run(s), {result.kernels} kernels)",
        f"policy: {verdict.policy.describe()}",
        f"first token divergence: {_step(result.first_token_divergence)}",
        f"first numeric divergence (sampled token's logprob bits): {_step(result.first_numeric_divergence)}"
        + (f" ({verdict.note})" if verdict.note else ""),
        f"why: {result.message}",
    ]
    if verdict.name:
        lines.insert(0, f"gated: {verdict.name}")
    if verdict.run_dir:
        lines.append(f"run directory: {verdict.run_dir}")
    return "\n".join(lines)


def _rl_details(result: ConditionResult, verdict: Verdict) -> str:
    lines = [f"condition: {result.condition_id} ({result.n_runs} sequence(s), {result.kernels} kernels, "
             "teacher-forced vs the sampler's logprobs)",
             f"policy: {verdict.policy.describe()}",
             f"first differing token (logprob bits vs the sampler's): {_step(result.first_numeric_divergence)}",
             f"why: {result.message}"]
    if verdict.run_dir:
        lines.append(f"run directory: {verdict.run_dir}")
    return "\n".join(lines)


def _attrs(**values) -> dict[str, str]:
    return {k: xml_safe(str(v)) for k, v in values.items()}


def _count(verdicts: Sequence[Verdict]) -> int:
    return sum(len(v.conditions) for v in verdicts)


def _step(value: int | None) -> str:
    return "none" if value is None else f"step {value}"
