"""The mode's conditions decoded by a second process beside the probe (probes/static/decode_ahead.py, rows_ahead.py).

On a CPU (NONDET_COMPILE_AHEAD=1: the host's cores alone would not start one) the probe decodes eagerly, as it
does on a GPU without --cuda-graphs; tests/gpu/test_cuda_graphs_gpu.py runs both paths on a GPU. Every probe that
takes rows from a second process has its control on the same model, NONDET_COMPILE_AHEAD=0 (every condition
decoded in the probe's process): the run directories' streams are the same records, run ids included, and the
summary counts the rows taken, so the comparison covers them.
"""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from nondet.probes.static import compile_ahead, decode_ahead, rows_ahead

PROMPT = "Tell me about Richard Feynman"
MODE = "batch-invariant"


def _config(model_dir, **fields):
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig

    fields = {"kernels": ("default", MODE), "out": "run", "max_new_tokens": 3, **fields}
    return ProbeConfig(prompt=PROMPT, model=ModelSpec(name=str(model_dir)), batch_sizes=(1, 2, 4), **fields)


def _streams(run_dir, name: str = "streams.jsonl") -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def _mode_conditions(run_dir) -> int:
    return sum(c["kernels"] == MODE for c in _streams(run_dir, "conditions.jsonl"))


def test_the_second_process_plans_every_condition_of_its_mode(tiny_model_dir):
    config = _config(tiny_model_dir, cuda_graphs=True, prompts=("Second prompt",), workers=2, budget=60.0,
                     argv=("probe",))
    helper = decode_ahead.helper_config(config, MODE)
    assert helper.kernels == (MODE,) and helper.out is None and helper.argv == ()
    assert helper.workers == 1 and helper.budget is None  # the whole plan, in its own process
    assert (helper.targets, helper.batch_sizes, helper.max_new_tokens) == (config.targets, (1, 2, 4), 3)
    assert helper.cuda_graphs and helper.placement == config.placement
    assert decode_ahead.modes(config) == (MODE,)  # the default kernels stay in the probe's process
    assert decode_ahead.modes(replace(config, kernels=(MODE,))) == (MODE,)
    assert decode_ahead.modes(replace(config, kernels=("default",))) == ()


def test_where_a_decoding_second_process_applies(tiny_model_dir, monkeypatch):
    monkeypatch.delenv(compile_ahead.ENV, raising=False)
    cpu = _config(tiny_model_dir)
    gpu = replace(cpu, model=replace(cpu.model, device="cuda"))
    assert compile_ahead.decodes_ahead(gpu) and compile_ahead.decodes_ahead(replace(gpu, cuda_graphs=True))
    assert not compile_ahead.decodes_ahead(cpu)  # a CPU probe splits its work with --workers
    assert not compile_ahead.decodes_ahead(replace(gpu, compile_backend="inductor"))  # compile_ahead.py's own
    assert not compile_ahead.decodes_ahead(replace(gpu, kernels=("default",)))
    monkeypatch.setenv(compile_ahead.ENV, "1")
    assert compile_ahead.decodes_ahead(cpu)
    assert compile_ahead.why_not(replace(cpu, workers=2), None) == ("--workers / --budget plan the conditions' "
                                                                   "processes themselves")


def test_before_the_load_the_checkpoint_says_how_much_memory_the_copy_takes(tiny_model_dir, tmp_path, monkeypatch):
    config = _config(tiny_model_dir, cuda_graphs=True)
    stored = sum(p.stat().st_size for p in tiny_model_dir.iterdir() if p.suffix == ".safetensors")
    assert stored and decode_ahead.before_load(config) == stored
    wide = replace(config, model=replace(config.model, dtype="float32"))
    assert decode_ahead.before_load(wide) == 2 * stored  # 16-bit files read as float32
    hub = replace(config, model=replace(config.model, name="org/model"))
    embedded = replace(config, model=replace(config.model, name=None))
    empty = replace(config, model=replace(config.model, name=str(tmp_path)))
    assert decode_ahead.before_load(hub) is None and decode_ahead.before_load(embedded) is None
    assert decode_ahead.before_load(empty) is None  # known after the load (which says what is wrong)
    # the device and cores come from the config before the load; the memory from those bytes
    monkeypatch.delenv(compile_ahead.ENV, raising=False)
    monkeypatch.setattr(compile_ahead.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    asked = []
    monkeypatch.setattr(compile_ahead, "_memory_short", lambda device, weights, copies: asked.append(
        (device.type, weights, copies)))
    on_gpu = replace(config, model=replace(config.model, device="cuda"))
    assert compile_ahead.why_not(on_gpu, None, weights=stored) is None
    assert asked == [("cuda", stored, compile_ahead.MEMORY_FACTOR + 1)]  # this process's own copy still to come
    assert compile_ahead.why_not(config, None, weights=stored) == "a cpu device (the two processes would share its cores)"


class _Running:
    def poll(self):
        return None


def test_started_before_the_load_it_is_not_started_again(tiny_model_dir, monkeypatch, tmp_path):
    started = []
    monkeypatch.setenv(compile_ahead.ENV, "1")
    monkeypatch.setattr(compile_ahead.subprocess, "Popen", lambda *a, **k: started.append(a) or _Running())
    monkeypatch.setattr(compile_ahead.tempfile, "tempdir", str(tmp_path))
    ahead = compile_ahead.CompileAhead()
    config = _config(tiny_model_dir, cuda_graphs=True)
    ahead.start(config, None)
    ahead.start(config, object())  # the call after the load
    assert len(started) == 1 and list(ahead.helpers) == [MODE] and ahead.helpers[MODE].decodes
    assert (ahead.helpers[MODE].folder / rows_ahead.CLAIMS).is_dir()
    assert not ahead.waits_for(MODE)  # a decoding second process is asked for rows, never waited for whole
    undecided = compile_ahead.CompileAhead()
    undecided.start(replace(config, model=replace(config.model, name=None)), None)  # the embedded model: after
    assert not undecided.decided and not undecided.helpers and not undecided.outcomes


def test_one_claim_per_condition_and_rows_handed_over_exactly(tmp_path):
    rows_ahead.prepare(tmp_path)
    assert rows_ahead.claim(tmp_path, "batch-invariant/bs4/p0") and not rows_ahead.claim(tmp_path, "batch-invariant/bs4/p0")
    assert rows_ahead.claim(tmp_path, "batch-invariant/bs4/p1")  # another condition, another claim

    def written() -> int:  # rows files in place (an aside .part file does not count)
        return len(list((tmp_path / rows_ahead.ROWS).glob("*.json")))

    assert rows_ahead.take(tmp_path, "batch-invariant/bs4/p0") is None and written() == 0
    rows = {3: [{"token": 7, "logprob": (-0.1).hex(), "top": [[7, (-0.1).hex()], [9, (-2.5).hex()]]}], 0: []}
    rows_ahead.put(tmp_path, "batch-invariant/bs4/p0", rows)
    assert rows_ahead.take(tmp_path, "batch-invariant/bs4/p0") == rows and written() == 1
    assert not list((tmp_path / rows_ahead.ROWS).glob("*.part"))


def test_the_second_process_decodes_from_the_end_up_to_the_probes_claims(tiny_model_dir, monkeypatch, tmp_path):
    from nondet.probes.static.source import StaticSource

    monkeypatch.setenv(compile_ahead.ENV, "0")
    source = StaticSource(_config(tiny_model_dir, kernels=(MODE,), out=None))
    source.open()
    try:
        plan = source.plan()
        rows_ahead.prepare(tmp_path)
        assert rows_ahead.claim(tmp_path, plan[0].condition_id)  # the probe has begun: it holds the first
        decoded = decode_ahead.decode_from_the_end(source, tmp_path)
        here = {p.condition_id: source.decoded_rows(p.plan) for p in plan[1:]}  # the control: this process's
    finally:
        source.close()
    assert len(plan) >= 3 and decoded == len(plan) - 1
    assert rows_ahead.take(tmp_path, plan[0].condition_id) is None
    assert {cid: rows_ahead.take(tmp_path, cid) for cid in here} == here and all(here.values())


@pytest.fixture
def helper_folder(monkeypatch, tmp_path):
    """Second processes' folders under tmp_path (each one removed once its probe ends)."""
    folder = tmp_path / "helpers"
    folder.mkdir()
    monkeypatch.setattr(compile_ahead.tempfile, "tempdir", str(folder))
    return folder


# probe_claims False: the second process decodes every condition; temperature 1: each request's seeded sampler
@pytest.mark.parametrize("probe_claims, temperature", [(False, 0.0), (True, 0.0), (False, 1.0)])
def test_the_probe_takes_the_second_processes_rows_and_writes_the_same_run(tiny_model_dir, monkeypatch, tmp_path,
                                                                          helper_folder, probe_claims, temperature):
    from nondet.probes.probe import run_probe

    monkeypatch.setattr(compile_ahead, "PROBE_CLAIMS", probe_claims)
    runs = {}
    for setting in ("1", "0"):  # "0": the control, every condition decoded in this process
        monkeypatch.setenv(compile_ahead.ENV, setting)
        runs[setting] = run_probe(_config(tiny_model_dir, out=str(tmp_path / f"run-{setting}"),
                                          temperature=temperature, seed=3, max_new_tokens=6))
    outcome = runs["1"].summary["decoded_ahead"][MODE]
    count = _mode_conditions(runs["0"].run_dir)
    if not probe_claims:
        assert outcome.startswith(f"{count} of the mode's {count} conditions decoded by a second process in "), outcome
    else:  # where the probe met it, or finished the mode first (a tiny model's sweep): either way every condition
        assert f" of the mode's {count} conditions decoded by a second process" in outcome, outcome
    assert "decoded_ahead" not in runs["0"].summary  # a CPU probe starts none unless asked
    assert _streams(runs["1"].run_dir) == _streams(runs["0"].run_dir)
    assert runs["1"].summary["modes"] == runs["0"].summary["modes"]
    assert not list(helper_folder.iterdir())  # its folder (settings, log, rows) removed
    if not probe_claims and not temperature:  # the report says where the mode's rows came from
        from nondet.reports.write import write_report

        markdown, _ = write_report(runs["1"].run_dir)
        assert f"{MODE} kernels: {count} of the mode's {count} conditions decoded by a second process" in \
            markdown.read_text()


@pytest.mark.parametrize("probe_claims", [False, True])
def test_a_second_process_that_fails_leaves_its_conditions_to_the_probe(tiny_model_dir, monkeypatch, tmp_path,
                                                                        helper_folder, probe_claims):
    from nondet.probes.probe import run_probe

    failing = [sys.executable, "-c", "import sys; print('ModelLoadError: model directory not found'); sys.exit(3)"]
    monkeypatch.setattr(compile_ahead, "_command", lambda argument: failing)
    popen = compile_ahead.subprocess.Popen

    def failed_by_now(*args, **kwargs):  # ended before the probe's end reads its exit, however busy the host
        process = popen(*args, **kwargs)
        process.wait()
        return process

    monkeypatch.setattr(compile_ahead.subprocess, "Popen", failed_by_now)
    monkeypatch.setattr(compile_ahead, "PROBE_CLAIMS", probe_claims)
    monkeypatch.setenv(compile_ahead.ENV, "1")
    config = _config(tiny_model_dir, out=str(tmp_path / "run"), max_new_tokens=8)
    run = run_probe(replace(config, model=replace(config.model, inject_variance=True)))
    count = _mode_conditions(run.run_dir)
    assert run.summary["decoded_ahead"][MODE] == (
        f"0 of the mode's {count} conditions decoded by a second process; it failed (exit 3: ModelLoadError: model "
        "directory not found), the rest decoded here")
    # the mode's conditions, all decoded here, are still invariant to the bit; control: the injected variance
    # diverges under the default kernels on the same case (its tokens need not flip in 8 steps: the bits do)
    mode, default = run.summary["modes"][MODE], run.summary["modes"]["default"]
    assert mode["distinct_completions"] == 1 and mode["first_numeric_divergence"] is None
    assert default["first_numeric_divergence"] is not None


def _helper(tmp_path, code: str) -> compile_ahead.Helper:
    folder = tmp_path / f"helper-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    rows_ahead.prepare(folder)
    (folder / compile_ahead.LOG).write_text("")
    process = subprocess.Popen([sys.executable, "-c", code.replace("FOLDER", repr(str(folder)))])
    return compile_ahead.Helper(MODE, process, folder, compile_ahead.time.time(), decodes=True)


def test_a_condition_claimed_by_a_process_that_died_is_decoded_here(tmp_path):
    ahead = compile_ahead.CompileAhead()
    helper = ahead.helpers[MODE] = _helper(tmp_path, "import time; time.sleep(0.3)")
    assert rows_ahead.claim(helper.folder, "c1")  # as the second process would, before it died
    assert ahead.rows(MODE, "c1", lambda: {0: ["here"]}) == {0: ["here"]}
    assert ahead.rows(MODE, "c2", lambda: {0: ["here too"]}) == {0: ["here too"]}  # claimed by the probe
    assert (helper.taken, helper.here) == (0, 2) and helper.waited >= 0.1
    ahead.close()
    assert not helper.folder.exists()


def test_rows_written_by_the_second_process_are_waited_for_and_taken(tmp_path):
    code = ("import time; from nondet.probes.static import rows_ahead; "
            "from pathlib import Path; time.sleep(0.3); rows_ahead.claim(Path(FOLDER), 'c1'); "
            "rows_ahead.put(Path(FOLDER), 'c1', {2: [{'token': 5}]}); time.sleep(30)")
    ahead = compile_ahead.CompileAhead()
    helper = ahead.helpers[MODE] = _helper(tmp_path, code)
    assert ahead.rows("default", "d1", lambda: {0: ["default, here"]}) == {0: ["default, here"]}  # not its mode
    deadline = compile_ahead.time.time() + 120  # its imports, on a busy host
    while not any((helper.folder / rows_ahead.CLAIMS).iterdir()):  # the second process has claimed it
        assert compile_ahead.time.time() < deadline
        compile_ahead.time.sleep(0.05)
    assert ahead.rows(MODE, "c1", lambda: pytest.fail("decoded here")) == {2: [{"token": 5}]}
    ahead.close()  # still running: stopped
    assert helper.process.poll() is not None and not helper.folder.exists()
    assert ahead.as_summary()[MODE].startswith("1 of the mode's 1 conditions decoded by a second process (the probe "
                                               "waited ")


def test_one_that_gives_no_rows_is_stopped_and_the_probe_decodes_them(tmp_path, monkeypatch):
    """A hung second process must not hang the probe: past ROWS_WAIT_S on one condition it is stopped."""
    monkeypatch.setattr(compile_ahead, "ROWS_WAIT_S", 0.5)
    ahead = compile_ahead.CompileAhead()
    helper = ahead.helpers[MODE] = _helper(tmp_path, "import time; time.sleep(60)")
    assert rows_ahead.claim(helper.folder, "c1")  # as the second process would, then hung
    started = compile_ahead.time.time()
    assert ahead.rows(MODE, "c1", lambda: {0: ["here"]}) == {0: ["here"]}
    assert 0.5 <= compile_ahead.time.time() - started < 15 and helper.process.poll() is not None
    ahead.close()
    assert ahead.as_summary() == {MODE: "0 of the mode's 1 conditions decoded by a second process; it gave no rows "
                                        "for 0 s and was stopped, the rest decoded here"}


def test_one_whose_mode_never_began_is_stopped(tmp_path):
    ahead = compile_ahead.CompileAhead()
    helper = ahead.helpers[MODE] = _helper(tmp_path, "import time; time.sleep(60)")
    ahead.close()
    assert helper.process.poll() is not None and not helper.folder.exists()
    assert ahead.as_summary() == {MODE: "stopped: the probe ended before its mode ran"}
