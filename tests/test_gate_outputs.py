"""JUnit XML and GitHub Actions outputs of a verdict, with hostile model text."""

import io
import xml.etree.ElementTree as ET

import pytest

from gate_fixtures import A, B, C, summary_of, sweep
from nondet.gate import Policy, evaluate, github
from nondet.gate.junit import junit_xml, write_junit, xml_safe


def violated(name=""):
    streams = sweep(bs4=(A, C), bs8=(A, B))  # bs4 flips to the hostile piece at step 3
    return evaluate(summary_of(streams), streams, Policy(), name=name, run_dir="runs/<gate>")


def met():
    streams = sweep()
    return evaluate(summary_of(streams), streams, Policy(), run_dir="runs/ok")


def test_junit_has_one_testcase_per_condition_and_names_the_failure(tmp_path):
    path = write_junit(tmp_path / "out" / "junit.xml", [violated()], seconds=1.5)
    root = ET.parse(path).getroot()  # parses: everything hostile was escaped
    assert (root.tag, root.get("tests"), root.get("failures")) == ("testsuites", "2", "2")
    cases = root.findall("testsuite/testcase")
    assert [c.get("name") for c in cases] == ["default/bs4/ends", "default/bs8/ends"]
    failure = cases[1].find("failure")
    assert failure.get("message") == ("first token divergence at step 5 (run 4, row 7, 1 of 2 runs): "
                                      "reference ' Queens' (margin 0.25) vs ' New' (margin 0.25)")
    assert "run directory: runs/<gate>" in failure.text
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props == {"policy": "identical", "run_dir": "runs/<gate>"}


def test_junit_escapes_control_characters_and_surrogates():
    xml = junit_xml([violated(name="prompt '\x00\udcff'")])
    root = ET.fromstring(xml.encode("utf-8"))
    message = root.find("testsuite/testcase/failure").get("message")
    assert "reference ' born' (margin 0.25) vs '<b>&\\x1b[31m\\n::error::pwn|x\\udcff'" in message
    assert root.find("testsuite").get("name") == "nondet gate: prompt '\\x00\\udcff'"


def test_xml_safe_keeps_text_xml_can_hold():
    assert xml_safe("tab\tnewline\n ünï 東京 \U0001f600") == "tab\tnewline\n ünï 東京 \U0001f600"
    assert xml_safe("\x00\x1b\ufffe\ud800") == "\\x00\\x1b\\ufffe\\ud800"


def test_junit_of_a_met_policy_has_no_failures():
    root = ET.fromstring(junit_xml([met()]))
    assert root.get("failures") == "0" and root.find(".//failure") is None


def test_annotations_are_one_line_each_and_cannot_inject_commands():
    lines = github.annotations([violated()])
    assert len(lines) == 2 and all(line.startswith("::error title=nondet gate%3A default/bs") for line in lines)
    assert all("\n" not in line for line in lines)
    assert "\\n::error::pwn" in lines[0]  # the piece's newline is shown escaped: no second command
    assert lines[1].endswith("::identical: first token divergence at step 5 (run 4, row 7, 1 of 2 runs): "
                             "reference ' Queens' (margin 0.25) vs ' New' (margin 0.25)")
    assert github.annotations([met()]) == [
        "::notice title=nondet gate::policy met (identical): 2 condition(s) agree with the reference"]


def test_workflow_command_data_is_percent_escaped():
    streams = sweep(bs8=(A, B))
    verdict = evaluate(summary_of(streams), streams, Policy(), name="a,b:c\nd")
    line = github.annotations([verdict])[0]
    assert line.startswith("::error title=nondet gate%3A default/bs8/ends [a%2Cb%3Ac%0Ad]::identical: ")


def test_emit_outside_github_actions_does_nothing(tmp_path):
    out = io.StringIO()
    summary = tmp_path / "summary.md"
    assert github.emit([violated()], env={"GITHUB_STEP_SUMMARY": str(summary)}, out=out) is None
    assert out.getvalue() == "" and not summary.exists()


def test_emit_appends_the_step_summary(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n")
    out = io.StringIO()
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    assert github.emit([violated()], env=env, out=out) == summary
    text = summary.read_text()
    assert text.startswith("# earlier step\n## nondet gate: ❌ policy violated (identical)\n")
    assert "| default/bs8/ends | 2 | 5 | 5 | ❌ first token divergence at step 5" in text
    assert "<b>" not in text and "&lt;b&gt;" in text  # model text cannot inject HTML
    assert out.getvalue().count("::error ") == 2


def test_markdown_cells_escape_pipes_and_newlines():
    assert github.md("a|b\nc <i>") == "a\\|b c &lt;i&gt;"


def test_step_summary_holds_the_bisect_result_and_explains_both_numbers(tmp_path):
    summary = tmp_path / "summary.md"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    line = "first differing activation bits at step 3 in model.layers.1.mlp.down_proj (matmul)"
    assert github.append_step_summary([violated()], env=env, bisects=[line]) == summary
    text = summary.read_text()
    assert "\nbisect: first differing activation bits at step 3 in model.layers.1.mlp.down\\_proj (matmul)\n" in text
    assert text.rstrip().endswith("_First numeric divergence: the first step where the sampled token's logprob bits "
                                  "differ from the reference. bisect's first differing step is the first where any "
                                  "activation differs: it can be earlier, when a difference is rounded away before "
                                  "it reaches the logprob._")


def test_unwritable_step_summary_raises_after_the_annotations(tmp_path):
    out = io.StringIO()
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(tmp_path)}  # a directory
    with pytest.raises(IsADirectoryError):
        github.emit([violated()], env=env, out=out)
    assert out.getvalue().count("::error ") == 2  # annotations first: the gate's CLI turns the rest into a warning
