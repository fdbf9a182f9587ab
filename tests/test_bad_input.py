"""Bad input and interrupts (issue 42): each gives ONE `nondet: error:` line and its exit code, never a
traceback. Most cases fail before a model loads and run in process (main(), the CLI's one error
boundary); Ctrl-C is sent to a real `nondet probe` / `nondet gate` process.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import cli_runner  # noqa: E402
from report_fixtures import write_run  # noqa: E402

from nondet.errors import PartialRunWarning, RunDirError  # noqa: E402
from nondet.rundir import RunDir  # noqa: E402

INTERRUPTED = "nondet: error: interrupted; streams already written stay in {out}, an unfinished run directory\n"


def cli(monkeypatch, capsys, *args) -> tuple[int, str]:
    """Run `nondet ARGS` in this process: (exit code, stderr)."""
    code, _, err = cli_runner.in_process(monkeypatch, capsys, *args)
    return code, err


def unfinished(path) -> str:
    return (f"nondet: error: {path}: unfinished run (no summary.json: it was interrupted, killed, or is still "
            "running); run it again\n")


# -- Ctrl-C -------------------------------------------------------------------------------------


def _interrupt(out: Path, *args) -> subprocess.CompletedProcess:
    """Start `nondet ARGS --out OUT`, wait until its first stream is on disk, send SIGINT."""
    env = {k: v for k, v in os.environ.items() if k != "NONDET_DEBUG"}
    proc = subprocess.Popen([sys.executable, "-m", "nondet", *map(str, args), "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a shell
    deadline = time.monotonic() + 240
    while not (out / "streams.jsonl").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"finished before it could be interrupted: {proc.communicate()}"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


# -n 24 at 8 batch sizes: the first stream (the reference) is written long before the last
_WORK = ("-p", "Tell me about Richard Feynman", "-n", "24", "-b", "1-8")


def test_ctrl_c_during_probe_exits_130_and_its_unfinished_run_is_refused(tmp_path, tiny_model_dir, monkeypatch,
                                                                          capsys):
    out = tmp_path / "r"
    r = _interrupt(out, "probe", "--model", tiny_model_dir, *_WORK, "--json")
    assert r.returncode == 130, r.stderr
    assert r.stderr == INTERRUPTED.format(out=out)
    assert not (out / "summary.json").exists()
    assert cli(monkeypatch, capsys, "report", out) == (4, unfinished(out))
    finished = write_run(tmp_path / "finished")
    assert cli(monkeypatch, capsys, "compare", finished, out) == (4, unfinished(out))
    assert cli(monkeypatch, capsys, "bisect", out) == (4, unfinished(out))


def test_ctrl_c_during_gate_exits_130(tmp_path, tiny_model_dir):
    out = tmp_path / "g"
    r = _interrupt(out, "gate", "--model", tiny_model_dir, *_WORK, "--no-bisect")
    assert r.returncode == 130, r.stderr
    assert r.stderr == INTERRUPTED.format(out=out)


def test_ctrl_c_during_rl_names_its_run_directory(tmp_path, tiny_model_dir):
    out = tmp_path / "rl"
    r = _interrupt(out, "rl", "--model", tiny_model_dir, "-n", "24", "--micro-batch", "1,2,4,8", "--confirm")
    assert r.returncode == 130, r.stderr
    assert r.stderr == (f"nondet: error: interrupted; what was already written stays in {out}, an unfinished run "
                        "directory\n")


def test_typer_hands_back_ctrl_c_and_exit_codes_as_return_values():
    """Outside standalone mode typer returns 130 for a KeyboardInterrupt and n for typer.Exit(n), and
    raises its Abort (a RuntimeError, not click's) for an end of input: what main() must turn into exit codes."""
    import typer

    app = typer.Typer()

    @app.command()
    def run(what: str) -> None:
        raise {"ctrl-c": KeyboardInterrupt(), "exit": typer.Exit(4), "eof": EOFError()}[what]

    assert app(["ctrl-c"], standalone_mode=False) == 130
    assert app(["exit"], standalone_mode=False) == 4
    with pytest.raises(Exception) as raised:
        app(["eof"], standalone_mode=False)
    assert type(raised.value).__name__ == "Abort"


@pytest.mark.parametrize("returned, code, stderr", [
    (130, 130, "nondet: error: interrupted (Ctrl-C)\n"),
    (4, 4, ""), (None, 0, ""), (0, 0, "")])
def test_main_turns_the_apps_return_value_into_the_exit_code(monkeypatch, capsys, returned, code, stderr):
    import nondet.cli.app as cli_app

    monkeypatch.setattr(cli_app, "_register_commands", lambda: None)
    monkeypatch.setattr(cli_app, "app", lambda standalone_mode: returned)
    assert cli(monkeypatch, capsys, "probe") == (code, stderr)


@pytest.mark.parametrize("abort_class", ["click.exceptions.Abort", "typer.exceptions.Abort"])
def test_an_abort_exits_130_with_one_line(monkeypatch, capsys, abort_class):
    import importlib

    import nondet.cli.app as cli_app

    module, name = abort_class.rsplit(".", 1)

    def abort(standalone_mode):
        raise getattr(importlib.import_module(module), name)()

    monkeypatch.setattr(cli_app, "_register_commands", lambda: None)
    monkeypatch.setattr(cli_app, "app", abort)
    assert cli(monkeypatch, capsys, "probe") == (130, "nondet: error: aborted (Ctrl-C or end of input)\n")


# -- an unfinished, torn or malformed run directory ----------------------------------------------


def test_report_and_compare_refuse_a_run_without_its_summary(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run")
    (run / "summary.json").unlink()  # killed before the last write
    assert cli(monkeypatch, capsys, "report", run) == (4, unfinished(run))
    assert cli(monkeypatch, capsys, "compare", run, write_run(tmp_path / "b")) == (4, unfinished(run))


def test_an_old_finished_run_still_reads(tmp_path, monkeypatch, capsys):
    """write_run writes format 1 (no format_version): summary.json alone says it finished."""
    run = write_run(tmp_path / "run")
    assert "format_version" not in json.loads((run / "config.json").read_text())
    assert cli(monkeypatch, capsys, "report", run) == (0, "")


def _tear(run: Path) -> int:
    """Cut streams.jsonl in the middle of its last line; returns that line's number."""
    text = (run / "streams.jsonl").read_text()
    (run / "streams.jsonl").write_text(text[:-40])
    return text.count("\n")


def test_report_on_torn_streams_warns_and_says_partial(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run")
    line = _tear(run)
    code, stderr = cli(monkeypatch, capsys, "report", run)
    assert code == 0
    assert stderr == (f"nondet: warning: {run / 'streams.jsonl'}:{line}: record cut off mid-write, left out; "
                      f"what is read from {run} is partial\n")
    verdict = (run / "report.md").read_text().split("## Prompts")[0]
    assert f"Partial: a record cut off mid-write at {run / 'streams.jsonl'}:{line} is left out" in verdict


def test_compare_on_a_torn_run_exits_4(tmp_path, monkeypatch, capsys):
    run, other = write_run(tmp_path / "run"), write_run(tmp_path / "other")
    line = _tear(run)
    assert cli(monkeypatch, capsys, "compare", other, run) == (
        4, f"nondet: error: {run / 'streams.jsonl'}:{line}: record cut off mid-write (the run was interrupted or the "
           "file truncated); this needs the whole run directory\n")


def _spoil_step(run: Path, line: int, **fields) -> None:
    lines = (run / "streams.jsonl").read_text().splitlines()
    record = json.loads(lines[line - 1])
    record["steps"][1].update(fields)
    lines[line - 1] = json.dumps(record)
    (run / "streams.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("fields, why", [
    ({"logprob": "zz"}, "field 'logprob' must be a float.hex() string, found 'zz'"),
    ({"top": [[1]]}, "field 'top' must hold [token, logprob] pairs, found [1]")])
def test_a_malformed_record_names_file_and_line_in_report_and_compare(tmp_path, monkeypatch, capsys, fields, why):
    run = write_run(tmp_path / "run")
    _spoil_step(run, 3, **fields)
    message = f"nondet: error: {run / 'streams.jsonl'}:3, step 1: {why}\n"
    assert cli(monkeypatch, capsys, "report", run) == (4, message)
    assert cli(monkeypatch, capsys, "compare", run, write_run(tmp_path / "b")) == (4, message)


def test_a_resumed_run_is_unfinished_until_its_new_summary(tmp_path):
    """The writer opening a directory again (a server probe's --resume) cuts the torn record off and takes
    the old summary away: it no longer describes the streams."""
    from nondet.rundir.reader import require_finished
    from nondet.rundir.writer import RunWriter

    run = write_run(tmp_path / "run")
    line = _tear(run)
    with pytest.warns(PartialRunWarning, match=f"streams.jsonl:{line}"):
        before = RunDir(run).read_jsonl("streams.jsonl")
    RunWriter(RunDir(run))
    assert RunDir(run).read_jsonl("streams.jsonl") == before  # no warning: the torn line is gone
    with pytest.raises(RunDirError, match="unfinished run"):
        require_finished(RunDir(run))


# -- flags and inputs ---------------------------------------------------------------------------


def _probe(monkeypatch, capsys, model, *args) -> tuple[int, str]:
    return cli(monkeypatch, capsys, "probe", "--model", model, "-n", "2", "-b", "1,2", "--json", *args)


def test_a_truncated_safetensors_file_is_exit_3_naming_it(tmp_path, tiny_model_dir, monkeypatch, capsys):
    model = shutil.copytree(tiny_model_dir, tmp_path / "m")
    weights = model / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:size // 2])
    code, stderr = _probe(monkeypatch, capsys, model, "--out", tmp_path / "r")
    assert code == 3
    assert stderr.startswith(f"nondet: error: cannot load model '{model}': {weights} is truncated: {size // 2} "
                             f"bytes of the {size} its header lists (SafetensorError: ")
    assert stderr.count("\n") == 1


def test_out_an_existing_file_is_exit_2(tmp_path, tiny_model_dir, monkeypatch, capsys):
    (tmp_path / "f").write_text("")
    assert _probe(monkeypatch, capsys, tiny_model_dir, "--out", tmp_path / "f") == (
        2, f"nondet: error: --out {tmp_path / 'f'} is a file; pass a directory path\n")
    assert _probe(monkeypatch, capsys, tiny_model_dir, "--out", tmp_path / "f" / "sub") == (
        2, f"nondet: error: --out {tmp_path / 'f' / 'sub'} lies under {tmp_path / 'f'}, which is not a directory; "
           "pass a directory path\n")


def test_out_in_a_read_only_folder_is_exit_2(tmp_path, tiny_model_dir, monkeypatch, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        pytest.skip("this user (root) may write into a read-only folder")
    assert _probe(monkeypatch, capsys, tiny_model_dir, "--out", folder / "r") == (
        2, f"nondet: error: --out {folder / 'r'}: cannot write into {folder} (permission denied); pass another "
           "path\n")


def test_a_prompt_that_is_not_utf8_is_exit_2(tmp_path, tiny_model_dir, monkeypatch, capsys):
    not_utf8 = os.fsdecode(b"\xff\xfeab")  # as Python hands over argv bytes that are not UTF-8
    message = ("nondet: error: --prompt is not UTF-8 text (byte 0xff at character 0); pass UTF-8, or the prompt "
               "in a UTF-8 file with --prompt-file\n")
    assert _probe(monkeypatch, capsys, tiny_model_dir, "-p", not_utf8, "--out", tmp_path / "r") == (2, message)
    assert cli(monkeypatch, capsys, "gate", "--model", tiny_model_dir, "-p", not_utf8) == (2, message)


@pytest.mark.parametrize("args, message", [
    (("--threads", "-1"), "--threads must be >= 1, not -1"),
    (("--threads", "0"), "--threads must be >= 1, not 0"),
    (("-n", "0"), "--max-new-tokens must be >= 1, not 0"),
    (("-b", ""), "--batch-sizes is empty; give sizes like 1,2,8 or a range like 1-16 (or leave the flag out for "
                 "the default)")])
def test_counts_and_sizes_that_mean_nothing_are_exit_2(tmp_path, tiny_model_dir, monkeypatch, capsys, args,
                                                        message):
    assert _probe(monkeypatch, capsys, tiny_model_dir, *args, "--out", tmp_path / "r") == (
        2, f"nondet: error: {message}\n")


def test_bisect_max_new_tokens_0_is_exit_2(tiny_model_dir, monkeypatch, capsys):
    assert cli(monkeypatch, capsys, "bisect", "--model", tiny_model_dir, "-n", "0") == (
        2, "nondet: error: --max-new-tokens must be >= 1, not 0\n")


def test_gate_threads_0_in_a_config_file_is_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "nondet.toml").write_text("threads = 0\n")
    assert cli(monkeypatch, capsys, "gate", "--config", tmp_path / "nondet.toml") == (
        2, f"nondet: error: {tmp_path / 'nondet.toml'}: threads must be >= 1, not 0\n")


def test_a_model_folder_with_no_model_is_exit_3(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    assert _probe(monkeypatch, capsys, tmp_path / "empty", "--out", tmp_path / "r") == (
        3, f"nondet: error: model directory {tmp_path / 'empty'} holds no model (no config.json); pass the "
           "directory save_pretrained wrote: config.json, the weights and the tokenizer\n")


def test_a_model_folder_without_weights_or_tokenizer_says_which(tmp_path, tiny_model_dir, monkeypatch, capsys):
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(tiny_model_dir / "config.json", config_only)
    code, stderr = _probe(monkeypatch, capsys, config_only, "--out", tmp_path / "r")
    assert (code, stderr) == (3, f"nondet: error: cannot load model '{config_only}': it has no weights file "
                                 "(model.safetensors or pytorch_model.bin) and no tokenizer file (tokenizer.json, "
                                 "tokenizer.model or vocab.json); pass the directory save_pretrained wrote (the "
                                 "model's and the tokenizer's)\n")
    no_weights = shutil.copytree(tiny_model_dir, tmp_path / "no-weights")
    for weights in no_weights.glob("*.safetensors"):
        weights.unlink()
    code, stderr = _probe(monkeypatch, capsys, no_weights, "--out", tmp_path / "r2")
    assert code == 3 and "it has no weights file" in stderr and "tokenizer file" not in stderr


def test_weights_that_leave_parameters_random_are_exit_3_in_one_line(tmp_path, tiny_model_dir):
    """transformers fills a parameter the checkpoint lacks with random values and goes on (a config.json of
    another architecture: every layer). Refused by name, and transformers' load report (a table) is not
    printed before the line. Cases: one tensor dropped from the weights; config.json's model_type changed to
    bert. Control: the untouched checkpoint passes the same check."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from nondet.probes.models.load_checks import check_weights_loaded

    partial = shutil.copytree(tiny_model_dir, tmp_path / "partial")
    weights = load_file(partial / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, partial / "model.safetensors", metadata={"format": "pt"})
    other = shutil.copytree(tiny_model_dir, tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    for model, said in ((partial, "1 parameter(s) of Qwen3ForCausalLM (model_type 'qwen3' in config.json) are not "
                                  "in its weights (e.g. model.norm.weight)"),
                        (other, "parameter(s) of BertLMHeadModel (model_type 'bert' in config.json)")):
        done = cli_runner.run(["probe", "--model", str(model), "-b", "1,2", "-n", "2", "--out", str(tmp_path / "r")])
        assert done.returncode == 3 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"nondet: error: cannot load model '{model}': ") and said in done.stderr
        assert not (tmp_path / "r").exists()
    _, info = AutoModelForCausalLM.from_pretrained(tiny_model_dir, output_loading_info=True)
    check_weights_loaded(str(tiny_model_dir), None, info)  # the control: nothing missing, no error


def test_a_bad_attn_implementation_is_a_usage_error(tmp_path, tiny_model_dir, monkeypatch, capsys):
    code, stderr = _probe(monkeypatch, capsys, tiny_model_dir, "--attn-implementation", "foo", "--out", tmp_path / "r")
    assert code == 2 and stderr.startswith("nondet: error: --attn-implementation foo: ") and stderr.count("\n") == 1
    assert " …\n" in stderr or len(stderr) < 300  # shortened at a word, not mid-word


@pytest.fixture
def short_context_model(tmp_path, tiny_model_dir) -> Path:
    """tiny_model_dir's model, its context cut to 64 positions."""
    model = shutil.copytree(tiny_model_dir, tmp_path / "short")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    return model


def test_a_prompt_longer_than_the_context_is_exit_2(tmp_path, short_context_model, monkeypatch, capsys):
    code, stderr = _probe(monkeypatch, capsys, short_context_model, "-p", "word " * 80, "--out", tmp_path / "r")
    assert code == 2
    assert stderr.startswith("nondet: error: the prompt is ")
    assert stderr.endswith(" tokens, longer than the model's context of 64 tokens (max_position_embeddings); "
                           "shorten it\n")
    code, stderr = cli(monkeypatch, capsys, "probe", "--model", short_context_model, "-p", "word " * 8, "-n", "60",
                       "--out", tmp_path / "r")
    assert code == 2
    assert "; with --max-new-tokens 60 a request reaches " in stderr and "context of 64 tokens" in stderr


def test_the_embedded_demo_model_is_checked_against_its_context_too(tmp_path, monkeypatch, capsys):
    # NONDET_DEMO_MODEL=random in the tests: the random demo, context 4096; -n past it decoded on
    code, stderr = cli(monkeypatch, capsys, "probe", "-n", "5000", "-b", "1,2", "--out", tmp_path / "r")
    assert code == 2 and "; with --max-new-tokens 5000 a request reaches " in stderr
    assert "context of 4096 tokens" in stderr and stderr.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_the_report_shortens_a_long_prompt():
    from nondet.reports.blocks import Model
    from nondet.reports.prompts import prompt_blocks

    long = "a" * 300 + "b" * 5000 + "c" * 100
    [table] = prompt_blocks({"prompt": long})
    assert table.rows[0][2] == [Model("a" * 300), " … ", Model("c" * 100), " (5,400 characters)"]
    [table] = prompt_blocks({"prompt": "short"})
    assert table.rows[0][2] == Model("short")


# -- the pytest plugin --------------------------------------------------------------------------


def test_assert_batch_invariant_refuses_zero_conditions():
    from nondet.pytest_plugin import assert_batch_invariant

    with pytest.raises(ValueError, match=r"^batch_sizes=\(1,\) leaves no condition to compare with the reference"):
        assert_batch_invariant(None, None, batch_sizes=(1,))
    with pytest.raises(ValueError, match="^prompts is empty"):
        assert_batch_invariant(None, None, prompts=[], batch_sizes=(1, 2))


def test_assert_speculative_equivalent_refuses_zero_comparisons():
    from nondet.pytest_plugin import assert_speculative_equivalent

    with pytest.raises(ValueError, match="^forms is empty"):
        assert_speculative_equivalent(None, None, forms=())
    with pytest.raises(ValueError, match="^prompts is empty"):
        assert_speculative_equivalent(None, None, prompts=[])
