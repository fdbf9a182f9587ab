"""`--cuda-graphs` (core/captured.py): decode steps replayed from CUDA graphs give the records of eager decoding on
the same static cache, for default kernels and the mode, at every batch size, on the call that records the graphs
and on the next one that only replays them. Control: a replay that is not handed the step's inputs (the copy into
the graph's buffers left out) makes other records, so the comparison sees the graphs. The whole probe: the mode 1
distinct, the injected variance still found under the default kernels, and the summary counts the replays; with the
mode's conditions decoded by a second process (static/decode_ahead.py), the same run as in one process."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

STEPS = 24


@pytest.fixture(scope="module")
def loaded(gpu_model_dir):
    from nondet.probes.models.loading import ModelSpec, load_model

    return load_model(ModelSpec(name=str(gpu_model_dir), device="cuda"))


def _records(loaded, condition, **settings):
    from nondet.probes.core.replay import DecodeSettings, replay_condition

    tok = loaded.tokenizer
    target = tok("Tell me about Richard Feynman", add_special_tokens=False)["input_ids"]
    filler = tok("The quick brown fox jumps", add_special_tokens=False)["input_ids"]
    return replay_condition(loaded.model, tok, condition, target, [filler], DecodeSettings(STEPS, 0.0, 0, **settings))


def _conditions(kernels: str):
    from nondet.probes.core.conditions import Condition

    return [Condition(f"t/bs{b}", kernels, b, (b - 1,), "same-length" if b > 1 else "none") for b in (1, 3, 4)]


@pytest.mark.parametrize("kernels", ["default", "batch-invariant"])
def test_replayed_steps_give_the_eager_static_cache_records(loaded, kernels):
    from nondet.probes.core import captured
    from nondet.probes.core.decoding_mode import decoding
    from nondet.probes.core.static_caches import reusable_static_cache

    with decoding(f"test-{kernels}"):
        before = captured.counts().get(f"test-{kernels}", {})
        for condition in _conditions(kernels):
            eager = _records(loaded, condition, kv_cache="static")
            recording = _records(loaded, condition, cuda_graphs=True)
            replaying = _records(loaded, condition, cuda_graphs=True)
            assert len(eager[condition.positions[0]]) == STEPS
            assert recording == eager and replaying == eager, condition.condition_id
        after = captured.counts()[f"test-{kernels}"]
    made = {what: after.get(what, 0) - before.get(what, 0) for what in after}
    # every decode step (2 calls of STEPS - 1 per shape) ran eagerly (a signature's first) or from a graph, and
    # each eager one was followed by its recording
    assert made["eager_steps"] + made["steps_replayed"] == 3 * 2 * (STEPS - 1)
    assert made["graphs_recorded"] == made["eager_steps"] >= 3
    if reusable_static_cache():  # the held cache (5.24+) keeps its addresses: a shape's next call only replays
        assert made["graphs_recorded"] == 3


def test_control_a_replay_without_the_steps_inputs_gives_other_records(loaded, monkeypatch):
    from nondet.probes.core import captured

    condition = _conditions("default")[1]
    eager = _records(loaded, condition, kv_cache="static")

    def stale(self, recorded, inputs):  # the graph replays the inputs it was recorded with
        recorded.graph.replay()
        return recorded.output

    monkeypatch.setattr(captured.CapturedSteps, "_replay", stale)
    loaded.model.__dict__.pop("_compiled_call", None)  # graphs recorded by the test above: record anew
    assert _records(loaded, condition, cuda_graphs=True) != eager


def test_probe_with_cuda_graphs_confirms_and_still_finds_the_variance(gpu_model_dir, tmp_path, monkeypatch):
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe
    from nondet.probes.static import compile_ahead

    monkeypatch.setenv(compile_ahead.ENV, "0")  # every graph recorded here, where the counts are read

    config = ProbeConfig(model=ModelSpec(name=str(gpu_model_dir), device="cuda", inject_variance=True),
                         batch_sizes=(1, 2, 4, 8), max_new_tokens=STEPS, kernels=("default", "batch-invariant"),
                         cuda_graphs=True, out=str(tmp_path / "run"))
    summary = run_probe(config).summary
    path = summary["decode_path"]
    assert path["backend"] == "cuda-graphs"
    for mode in ("default", "batch-invariant"):
        assert path["modes"][mode]["path"] == "cuda-graphs"
        assert path["modes"][mode]["graphs_recorded"] >= 4 and path["modes"][mode]["steps_replayed"] > 0
    assert summary["modes"]["batch-invariant"]["distinct_completions"] == 1
    assert summary["modes"]["default"]["first_numeric_divergence"] is not None  # the injected norm, in the graphs too


def _family_probe(tmp_path, family: str, **fields) -> tuple[dict, dict]:
    """(summary, run id -> steps) of a `--confirm` probe of a tiny model of the family, bf16, batch sizes 1, 2, 4."""
    from family_models import save_family
    from test_partial_utf8 import _tokenizer

    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe
    from nondet.rundir import RunDir
    from nondet.rundir.reader import read_streams

    directory = tmp_path / family
    if not directory.exists():
        save_family(family, directory, _tokenizer())
    out = tmp_path / f"{family}-{len(list(tmp_path.iterdir()))}"
    config = ProbeConfig(prompt="Tell me about Richard Feynman", batch_sizes=(1, 2, 4), max_new_tokens=16,
                         model=ModelSpec(name=str(directory), dtype="bfloat16", device="cuda"),
                         kernels=("default", "batch-invariant"), out=str(out), **fields)
    summary = run_probe(config).summary
    return summary, {s.run_id: s.steps for s in read_streams(RunDir(out), whole=True)}


def test_moe_routing_is_read_from_the_replayed_steps(tmp_path):
    """A Qwen3-MoE: every step's experts recorded from the graphs equal eager decoding's, tokens and bits too."""
    eager_summary, eager = _family_probe(tmp_path, "qwen3-moe", kv_cache="static")
    summary, graphs = _family_probe(tmp_path, "qwen3-moe", cuda_graphs=True)
    assert {m["path"] for m in summary["decode_path"]["modes"].values()} == {"cuda-graphs"}
    assert all("experts" in step.extra for steps in graphs.values() for step in steps)  # every replayed step's routing
    assert graphs == eager


def test_a_sliding_window_cache_decodes_eager_and_says_why(tmp_path):
    """transformers' sliding-window cache counts its length in a Python int: not recorded, eager instead."""
    summary, graphs = _family_probe(tmp_path, "gemma2", cuda_graphs=True)
    for mode in summary["decode_path"]["modes"].values():
        assert mode["path"] == "eager" and "cumulative_length_int" in mode["reason"], mode
    assert graphs == _family_probe(tmp_path, "gemma2", kv_cache="static")[1]



def _cli_probe(gpu_model_dir, out, **env) -> dict:
    """`nondet probe --cuda-graphs --confirm` in a process of its own (Triton's compiled kernels of this one, in
    memory, would hide what it compiles), with `env` added; its streams by run id."""
    import os
    import subprocess
    import sys

    from nondet.rundir import RunDir
    from nondet.rundir.reader import read_streams

    argv = ["probe", "--model", str(gpu_model_dir), "--device", "cuda", "--confirm", "-b", "1,2,4,8", "-n",
            str(STEPS), "-p", "Tell me about Richard Feynman", "--cuda-graphs", "--inject-variance", "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "nondet", *argv], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {s.run_id: s.steps for s in read_streams(RunDir(out), whole=True)}


def _mode_conditions(run_dir) -> int:
    import json

    lines = (run_dir / "conditions.jsonl").read_text().splitlines()
    return sum(json.loads(line)["kernels"] == "batch-invariant" for line in lines)


@pytest.mark.parametrize("cuda_graphs", [True, False])  # False: eager, the default path on CUDA
def test_the_modes_rows_from_a_second_process_are_the_bits_of_one_process(gpu_model_dir, tmp_path, monkeypatch,
                                                                          cuda_graphs):
    """A second process decodes every condition of the mode (the probe claims none: PROBE_CLAIMS False); the
    probe's run is its control's, NONDET_COMPILE_AHEAD=0 (every condition in one process), record for record; the
    mode 1 distinct, the injected variance still found under the default kernels."""
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe
    from nondet.probes.static import compile_ahead
    from nondet.rundir import RunDir
    from nondet.rundir.reader import read_streams

    monkeypatch.setattr(compile_ahead, "PROBE_CLAIMS", False)
    monkeypatch.setattr(compile_ahead.tempfile, "tempdir", str(tmp_path))
    runs = {}
    for setting in ("1", "0"):
        monkeypatch.setenv(compile_ahead.ENV, setting)
        config = ProbeConfig(model=ModelSpec(name=str(gpu_model_dir), device="cuda", inject_variance=True),
                             batch_sizes=(1, 2, 4, 8), max_new_tokens=STEPS, kernels=("default", "batch-invariant"),
                             cuda_graphs=cuda_graphs, out=str(tmp_path / f"run-{setting}"))
        runs[setting] = run_probe(config)
    summary = runs["1"].summary
    outcome = (summary["decode_path"]["compiled_ahead"] if cuda_graphs else summary["decoded_ahead"])["batch-invariant"]
    n = _mode_conditions(runs["0"].run_dir)
    assert outcome.startswith(f"{n} of the mode's {n} conditions decoded by a second process"), outcome
    streams = {s: {r.run_id: r.steps for r in read_streams(RunDir(runs[s].run_dir), whole=True)} for s in runs}
    assert streams["1"] == streams["0"]
    assert summary["modes"]["batch-invariant"]["distinct_completions"] == 1
    assert summary["modes"]["default"]["first_numeric_divergence"] is not None


def test_the_probe_meets_the_second_process_and_says_what_it_did(gpu_model_dir, tmp_path):
    """`probe --cuda-graphs --confirm` as a user runs it: the probe and the second process share the mode's
    conditions (whichever claims one first decodes it); the streams are the control's, without one. The injected
    variance is found under the default kernels of the same run: the mode's one completion is its fix."""
    import json

    from nondet.probes.static import compile_ahead

    runs = {}
    for setting in ("1", "0"):  # forced on: the test host may have fewer cores than it asks for
        env = {"NONDET_CACHE": str(tmp_path / "cache"), compile_ahead.ENV: setting}
        runs[setting] = _cli_probe(gpu_model_dir, tmp_path / f"run-{setting}", **env)
    summary = json.loads((tmp_path / "run-1" / "summary.json").read_text())
    n = _mode_conditions(tmp_path / "run-1")
    assert f" of the mode's {n} conditions decoded by a second process" in \
        summary["decode_path"]["compiled_ahead"]["batch-invariant"]
    assert summary["modes"]["batch-invariant"]["distinct_completions"] == 1
    assert summary["modes"]["batch-invariant"]["first_numeric_divergence"] is None
    assert summary["modes"]["default"]["first_numeric_divergence"] is not None
    assert runs["1"] == runs["0"]
