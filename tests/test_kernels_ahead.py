"""`--cuda-graphs`: a second process compiles the mode's Triton binaries beside the probe (probes/static/kernels_ahead.py).

It warms up every batch shape of the mode, last first, and is not waited for. The lifecycle cases use stand-in
processes; the warm-ups use the real static source on the compiled path (aot_eager on the CPU: CUDA graphs need a
GPU, where tests/gpu/test_cuda_graphs_gpu.py runs the whole probe with it and without it, the same bits).
"""

import subprocess
import sys
from dataclasses import replace

from nondet.probes import ahead_process
from nondet.probes.core import precompiled
from nondet.probes.static import compile_ahead, kernels_ahead

PROMPT = "Tell me about Richard Feynman"
MODE = "batch-invariant"


def _config(model_dir, **fields):
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig

    fields = {"kernels": ("default", MODE), **fields}
    return ProbeConfig(prompt=PROMPT, model=ModelSpec(name=str(model_dir)), batch_sizes=(1, 2, 4), max_new_tokens=3,
                       out="run", **fields)


def test_the_second_process_plans_every_shape_of_its_mode(tiny_model_dir):
    config = _config(tiny_model_dir, cuda_graphs=True, prompts=("Second prompt",), workers=2, budget=60.0,
                     argv=("probe",))
    helper = kernels_ahead.warm_up_config(config, MODE)
    assert helper.kernels == (MODE,) and helper.out is None and helper.argv == ()
    assert helper.workers == 1 and helper.budget is None  # the whole plan, in its own process
    assert (helper.targets, helper.batch_sizes, helper.max_new_tokens) == (config.targets, (1, 2, 4), 3)
    assert helper.cuda_graphs and helper.placement == config.placement
    assert kernels_ahead.modes(config) == (MODE,)  # the default kernels compile nothing
    assert kernels_ahead.modes(replace(config, kernels=(MODE,))) == (MODE,)
    assert kernels_ahead.modes(replace(config, kernels=("default",))) == ()


def test_saved_steps_off_do_not_stop_it(tiny_model_dir, monkeypatch):
    config = _config(tiny_model_dir, cuda_graphs=True)
    model = type("M", (), {"device": type("D", (), {"type": "cuda"})()})()
    monkeypatch.setenv(compile_ahead.ENV, "1")
    monkeypatch.setenv(precompiled.ENV, "0")
    assert compile_ahead.why_not(config, model) is None  # no saved step is involved
    assert compile_ahead.why_not(replace(config, cuda_graphs=False), model) == f"saved steps off ({precompiled.ENV}=0)"


def test_before_the_load_the_checkpoint_says_how_much_memory_the_copy_takes(tiny_model_dir, tmp_path, monkeypatch):
    config = _config(tiny_model_dir, cuda_graphs=True)
    stored = sum(p.stat().st_size for p in tiny_model_dir.iterdir() if p.suffix == ".safetensors")
    assert stored and kernels_ahead.before_load(config) == stored
    wide = replace(config, model=replace(config.model, dtype="float32"))
    assert kernels_ahead.before_load(wide) == 2 * stored  # 16-bit files read as float32
    hub = replace(config, model=replace(config.model, name="org/model"))
    embedded = replace(config, model=replace(config.model, name=None))
    empty = replace(config, model=replace(config.model, name=str(tmp_path)))
    assert kernels_ahead.before_load(hub) is None and kernels_ahead.before_load(embedded) is None
    assert kernels_ahead.before_load(empty) is None  # known after the load (which says what is wrong)
    # the device and cores come from the config before the load; the memory from those bytes
    monkeypatch.delenv(compile_ahead.ENV, raising=False)
    monkeypatch.setattr(compile_ahead.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    asked = []
    monkeypatch.setattr(compile_ahead, "_memory_short", lambda device, weights, copies: asked.append(
        (device.type, weights, copies)))
    on_gpu = replace(config, model=replace(config.model, device="cuda"))
    assert compile_ahead.why_not(on_gpu, None, weights=stored) is None
    assert asked == [("cuda", stored, compile_ahead.MEMORY_FACTOR + 1)]  # this process's own copy still to come
    assert compile_ahead.why_not(config, None, weights=stored) == "a cpu device (the two compiles share its cores)"


def test_started_before_the_load_it_is_not_started_again(tiny_model_dir, monkeypatch, tmp_path):
    started = []
    monkeypatch.setenv(compile_ahead.ENV, "1")
    monkeypatch.setattr(compile_ahead.subprocess, "Popen", lambda *a, **k: started.append(a) or _Running())
    monkeypatch.setattr(compile_ahead.tempfile, "tempdir", str(tmp_path))
    ahead = compile_ahead.CompileAhead()
    config = _config(tiny_model_dir, cuda_graphs=True)
    ahead.start(config, None)
    ahead.start(config, object())  # the call after the load
    assert len(started) == 1 and list(ahead.helpers) == [MODE] and ahead.helpers[MODE].binaries
    undecided = compile_ahead.CompileAhead()
    undecided.start(replace(config, model=replace(config.model, name=None)), None)  # the embedded model: after
    assert not undecided.decided and not undecided.helpers and not undecided.outcomes


class _Running:
    def poll(self):
        return None


def test_the_warm_ups_run_last_first_and_decode_nothing(tiny_model_dir, monkeypatch, tmp_path):
    from nondet.probes.static.source import StaticSource

    monkeypatch.setenv(compile_ahead.ENV, "0")
    monkeypatch.setenv("NONDET_CACHE", str(tmp_path / "cache"))
    source = StaticSource(_config(tiny_model_dir, kernels=(MODE,), compile_backend="aot_eager"))
    source.open()
    try:
        shapes = []
        warm_only = source.decoder.warm_only
        monkeypatch.setattr(source.decoder, "warm_only",
                            lambda mode, run, shape=None: (shapes.append(shape), warm_only(mode, run, shape)))
        ahead_process.warm_up_from_the_end(source)
        plan = source.plan()
    finally:
        source.close()
    planned = [source._runner(p.plan)[1] for p in plan]
    assert shapes == planned[::-1] and len(set(shapes)) >= 3  # every condition, the probe's last first
    entry = source.decoder.paths.modes[MODE]
    assert entry.warm_ups == len(set(shapes))  # one warm-up a shape: the references share batch 1's
    assert entry.conditions == 0  # nothing decoded
    # control: the probe's own loop on the same source decodes every condition
    again = StaticSource(_config(tiny_model_dir, kernels=(MODE,), compile_backend="aot_eager"))
    from nondet.probes.probe import run_streams

    again.open()
    try:
        streams = run_streams(again, None)
    finally:
        again.close()
    assert again.decoder.paths.modes[MODE].conditions == len(plan) and streams


def _helper(tmp_path, code: str, started: float | None = None) -> compile_ahead.Helper:
    folder = tmp_path / f"helper-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / compile_ahead.LOG).write_text("")
    finished = folder / compile_ahead.FINISHED
    code = code.replace("FINISHED", repr(str(finished)))
    process = subprocess.Popen([sys.executable, "-c", code])
    now = compile_ahead.time.time() if started is None else started
    return compile_ahead.Helper(MODE, process, folder, now, binaries=True)


WRITES_FINISHED = "import time; open(FINISHED, 'w').write(repr(time.time()))"


def test_one_done_before_the_mode_is_reported_and_removed(tmp_path):
    ahead = compile_ahead.CompileAhead()
    helper = ahead.helpers[MODE] = _helper(tmp_path, WRITES_FINISHED)
    helper.process.wait()
    ahead.wait(MODE, cache_warm=True)  # a warm cache does not stop it: it is done
    outcome = ahead.as_summary()[MODE]
    assert outcome.startswith("kernels compiled by a second process in ") and outcome.endswith("(before the mode began)")
    assert not ahead.helpers and not helper.folder.exists()


def test_one_still_running_is_not_waited_for_and_goes_on_beside_the_mode(tmp_path):
    ahead = compile_ahead.CompileAhead()
    helper = ahead.helpers[MODE] = _helper(tmp_path, "import time; time.sleep(1.5); " + WRITES_FINISHED)
    started = compile_ahead.time.time()
    ahead.wait(MODE, cache_warm=False)
    assert compile_ahead.time.time() - started < 1.0 and helper.process.poll() is None  # not waited for
    ahead.wait(MODE, cache_warm=False)  # the mode's next warm-up: still nothing to wait for
    assert ahead.helpers[MODE] is helper and helper.beside is not None
    helper.process.wait()
    ahead.close()
    outcome = ahead.as_summary()[MODE]
    assert outcome.startswith("kernels compiled by a second process in ") and "s of it beside the mode)" in outcome
    assert not helper.folder.exists()


def test_one_unfinished_at_the_end_is_stopped(tmp_path):
    ahead = compile_ahead.CompileAhead()
    helper = ahead.helpers[MODE] = _helper(tmp_path, "import time; time.sleep(60)")
    ahead.wait(MODE, cache_warm=False)
    ahead.close()
    assert helper.process.poll() is not None and not helper.folder.exists()
    assert ahead.as_summary()[MODE].startswith("kernels compiled by a second process beside the mode; stopped at "
                                               "the probe's end, ")


def test_one_that_failed_says_so(tmp_path):
    ahead = compile_ahead.CompileAhead()
    helper = _helper(tmp_path, "import sys; print('ModelLoadError: model directory not found'); sys.exit(3)")
    helper.process.wait()
    helper.folder.joinpath(compile_ahead.LOG).write_text("ModelLoadError: model directory not found\n")
    ahead.helpers[MODE] = helper
    ahead.wait(MODE, cache_warm=False)
    assert ahead.as_summary() == {MODE: "second process failed (exit 3: ModelLoadError: model directory not found): "
                                        "kernels compiled here"}


def test_a_plan_whose_conditions_all_ran_starts_no_second_process_next_time(tiny_model_dir, monkeypatch, tmp_path):
    """A probe that ran every condition of the mode marks its plan (its binaries are in the cache); the next probe
    of that plan starts none. Controls: another plan, or another Triton cache, still starts one."""
    started = []
    monkeypatch.setenv(compile_ahead.ENV, "1")
    monkeypatch.setenv("NONDET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(compile_ahead.subprocess, "Popen", lambda *a, **k: started.append(a) or _Running())
    monkeypatch.setattr(compile_ahead.tempfile, "tempdir", str(tmp_path))
    config = _config(tiny_model_dir, cuda_graphs=True)

    def start(config) -> compile_ahead.CompileAhead:
        ahead = compile_ahead.CompileAhead()
        ahead.start(config, object())
        return ahead

    first = start(config)
    assert len(started) == 1 and not first.outcomes
    first.finished(["default"])  # the default kernels compile nothing: no marker
    assert len(started) == 1 and start(config).helpers and len(started) == 2
    first.finished([MODE])
    again = start(config)
    assert len(started) == 2 and not again.helpers
    assert again.as_summary() == {MODE: f"not started: {compile_ahead.MARKED}"}
    assert start(replace(config, batch_sizes=(1, 2))).helpers and len(started) == 3  # another plan
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert start(config).helpers and len(started) == 4  # another cache holds none of them
    compiled = compile_ahead.CompileAhead()
    compiled.config = replace(config, cuda_graphs=False, compile_backend="aot_eager")
    compiled.finished([MODE])  # the compiled path's saved steps have their own keys: no marker
    assert len(list((tmp_path / "cache" / kernels_ahead.MARKERS).iterdir())) == 1  # the first plan's alone
