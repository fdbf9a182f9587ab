"""A later kernels mode's decode step compiled by a second process (probes/static/compile_ahead.py).

The probes compile with aot_eager: the same saved-step path as Inductor (save, key, load), in seconds.
Each case that finds the second process's work has its control on the same model: with
NONDET_COMPILE_AHEAD=0 the mode's step is compiled in the probe's own process, and the streams of both
are the same bits.
"""

import json
import subprocess
import sys
from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest

from nondet.probes.core import precompiled
from nondet.probes.static import compile_ahead
from nondet.prompt import chat_of

PROMPT = "Tell me about Richard Feynman"
MODE = "batch-invariant"
CHAT = chat_of([{"role": "user", "content": "Hi"}], "test")


def _config(model_dir, out, **fields):
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig

    return ProbeConfig(prompt=PROMPT, model=ModelSpec(name=str(model_dir)), batch_sizes=(1, 2), max_new_tokens=3,
                       kernels=("default", MODE), compile_backend="aot_eager", out=str(out), **fields)


def _mode_streams(run_dir) -> dict:
    """The mode's streams by (condition, row): tokens and logprobs as stored (exact)."""
    streams = {}
    for line in (run_dir / "streams.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kernels"] == MODE:
            steps = [(s["token"], s["logprob"]) for s in record["steps"]]
            streams[(record["condition_id"], record["position"])] = steps
    return streams


def test_the_mode_loads_the_step_a_second_process_compiled(tmp_path, tiny_model_dir, monkeypatch):
    from nondet.probes.probe import run_probe

    monkeypatch.setattr(compile_ahead.tempfile, "tempdir", str(tmp_path))  # where the second process's folder goes
    runs = {}
    for setting in ("1", "0"):  # "0": the control, the mode compiled in this process
        monkeypatch.setenv(compile_ahead.ENV, setting)
        monkeypatch.setenv("NONDET_CACHE", str(tmp_path / f"cache-{setting}"))  # cold: nothing saved before
        runs[setting] = run_probe(_config(tiny_model_dir, tmp_path / f"run-{setting}"))
    ahead, control = (runs[s].summary["decode_path"] for s in ("1", "0"))
    assert ahead["compiled_ahead"][MODE].startswith("compiled by a second process in "), ahead["compiled_ahead"]
    assert ahead["precompiled"][MODE] == {precompiled.EVERY_BATCH: "loaded"}
    assert ahead["modes"][MODE]["graphs_traced"] == 0
    assert ahead["precompiled"]["default"][precompiled.EVERY_BATCH] == "compiled and saved"  # the first mode: here
    assert control["compiled_ahead"] == {MODE: f"not started: {compile_ahead.ENV}=0"}
    assert control["precompiled"][MODE] == {precompiled.EVERY_BATCH: "compiled and saved"}
    assert control["modes"][MODE]["graphs_traced"] >= 1
    streams = _mode_streams(runs["1"].run_dir)
    assert streams and streams == _mode_streams(runs["0"].run_dir)
    assert not list(tmp_path.glob("nondet-ahead-*"))  # its folder (run directory, log) removed once waited for

    # warm: the default's steps loaded, so the second process is stopped, not waited for; the mode's step loads
    monkeypatch.setenv(compile_ahead.ENV, "1")
    monkeypatch.setenv("NONDET_CACHE", str(tmp_path / "cache-1"))
    warm = run_probe(_config(tiny_model_dir, tmp_path / "run-warm"))
    outcome = warm.summary["decode_path"]["compiled_ahead"][MODE]
    assert outcome == "stopped: the earlier kernels modes' steps were loaded (a warm cache)"
    assert warm.summary["decode_path"]["precompiled"]["default"] == {precompiled.EVERY_BATCH: "loaded"}
    assert warm.summary["decode_path"]["precompiled"][MODE] == {precompiled.EVERY_BATCH: "loaded"}
    assert _mode_streams(warm.run_dir) == streams


def test_a_second_process_that_fails_leaves_the_mode_to_compile_here(tmp_path, tiny_model_dir, monkeypatch):
    from nondet.probes.probe import run_probe

    failing = [sys.executable, "-c", "import sys; print('ModelLoadError: model directory not found'); sys.exit(3)"]
    monkeypatch.setattr(compile_ahead, "_command", lambda argument: failing)
    monkeypatch.setenv(compile_ahead.ENV, "1")
    monkeypatch.setenv("NONDET_CACHE", str(tmp_path / "cache"))
    summary = run_probe(_config(tiny_model_dir, tmp_path / "run")).summary["decode_path"]
    assert summary["compiled_ahead"][MODE] == ("second process failed (exit 3: ModelLoadError: model directory not "
                                               "found): compiled here")
    assert summary["precompiled"][MODE] == {precompiled.EVERY_BATCH: "compiled and saved"}
    assert summary["modes"][MODE]["path"] == "compiled"


def test_closing_stops_a_second_process_still_running(tmp_path):
    ahead = compile_ahead.CompileAhead()
    folder = tmp_path / "helper"
    folder.mkdir()
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ahead.helpers[MODE] = compile_ahead.Helper(MODE, process, folder, 0.0)
    assert ahead.waits_for(MODE) and not ahead.waits_for("default")
    ahead.close()
    assert process.poll() is not None and not folder.exists()
    assert ahead.as_summary() == {MODE: "stopped: the probe ended before its mode ran"}
    assert not ahead.waits_for(MODE)  # nothing left to wait for
    ahead.wait(MODE, cache_warm=False)
    assert not ahead.helpers


@pytest.mark.parametrize("writes_finished", [True, False])  # False: the control, the time until the wait ended
def test_a_second_process_done_before_the_wait_is_timed_to_its_end(tmp_path, writes_finished):
    ahead = compile_ahead.CompileAhead()
    finished = tmp_path / compile_ahead.FINISHED
    code = f"import time; open({str(finished)!r}, 'w').write(repr(time.time()))" if writes_finished else "pass"
    process = subprocess.Popen([sys.executable, "-c", code])
    ahead.helpers[MODE] = compile_ahead.Helper(MODE, process, tmp_path, compile_ahead.time.time())
    process.wait()
    compile_ahead.time.sleep(2.0)  # the probe reaches the mode well after the second process ended
    ahead.wait(MODE, cache_warm=False)
    took = float(ahead.as_summary()[MODE].removeprefix("compiled by a second process in ").split(" s ")[0])
    assert (took < 1.5) if writes_finished else (took >= 2.0), ahead.as_summary()


def test_a_second_process_past_its_time_is_stopped_and_the_mode_compiles_here(tmp_path, monkeypatch):
    monkeypatch.setattr(compile_ahead, "WAIT_S", 0.5)
    ahead = compile_ahead.CompileAhead()
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ahead.helpers[MODE] = compile_ahead.Helper(MODE, process, tmp_path, compile_ahead.time.time())
    ahead.wait(MODE, cache_warm=False)
    assert process.poll() is not None
    assert ahead.as_summary() == {MODE: "stopped after 0 s unfinished: compiled here"}


def _model(device="cpu"):
    return SimpleNamespace(device=SimpleNamespace(type=device))


def test_where_no_second_process_is_started(tmp_path, tiny_model_dir, monkeypatch):
    config = _config(tiny_model_dir, tmp_path / "run")
    monkeypatch.delenv(compile_ahead.ENV, raising=False)
    monkeypatch.delenv(precompiled.ENV, raising=False)
    assert compile_ahead.why_not(config, _model()) == "a cpu device (the two processes would share its cores)"
    monkeypatch.setattr(compile_ahead.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert compile_ahead.why_not(config, _model("cuda")) == "2 cores (fewer than 8)"
    monkeypatch.setenv(compile_ahead.ENV, "1")
    assert compile_ahead.why_not(config, _model()) is None  # forced: any device, any cores
    assert compile_ahead.why_not(config, _model(), in_memory=True).startswith("a model handed over in memory")
    assert compile_ahead.why_not(replace(config, prefill=("chunk:8",)), _model()) == "the compiled step of another axis"
    monkeypatch.setenv(precompiled.ENV, "0")
    assert compile_ahead.why_not(config, _model()) == f"saved steps off ({precompiled.ENV}=0)"
    monkeypatch.setenv(compile_ahead.ENV, "0")
    assert compile_ahead.why_not(config, _model()) == f"{compile_ahead.ENV}=0"
    ahead = compile_ahead.CompileAhead()
    ahead.start(replace(config, kernels=("default",)), _model())
    assert not ahead.helpers and not ahead.as_summary()  # one mode: nothing to say


def test_the_second_process_runs_the_first_prompt_alone_under_its_mode(tmp_path, tiny_model_dir):
    config = _config(tiny_model_dir, tmp_path / "run", prompts=(CHAT, "Second"), chat=True,
                     placement="rows", trials=2, argv=("probe",))
    helper = compile_ahead.helper_config(config, MODE)
    assert helper.targets == (config.targets[0],) and helper.batch_sizes == (1,) and helper.kernels == (MODE,)
    assert helper.chat and helper.compile_backend == "aot_eager" and helper.max_new_tokens == config.max_new_tokens
    assert helper.model == config.model and helper.out is None and helper.trials == 1


def test_a_probe_config_survives_its_stored_form(tmp_path, tiny_model_dir):
    from nondet.probes.core.load_config import LoadConfig
    from nondet.probes.core.stored_config import from_stored
    from nondet.probes.probe import ProbeConfig

    config = _config(tiny_model_dir, tmp_path / "run", prompts=(CHAT, "Second"), speculative=("ngram:4",),
                     tp=(1, 2), prefill=("chunk:8",), load=LoadConfig(rate=2.0))
    assert from_stored(ProbeConfig, json.loads(json.dumps(asdict(config)))) == config
    assert from_stored(ProbeConfig, {"max_new_tokens": 7}) == ProbeConfig(max_new_tokens=7)  # the rest: defaults
