"""`probe --compile`: every condition decoded by transformers' compiled generate (static cache), each
kernels mode labelled with the path it took, compile time apart from decode time.

Most tests use the "aot_eager" backend (torch.compile's tracing and graphs, the aten kernels eager
uses: fast on 2 cores); one CLI test runs Inductor itself, the path `--compile` takes. Positive
control: the injected batch-variant norm is still found on the compiled path; negative: the mode's
compiled streams equal its eager ones bit for bit, one distinct completion.
"""

import json
from pathlib import Path

import pytest

from nondet.errors import NondetError
from nondet.probes.core.compiled import DecodePaths
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe
from nondet.probes.core.static_caches import reusable_static_cache
import cli_runner
from controls import FIX_KERNELS, require_divergence

# transformers before 5.24 refuses --speculative --compile (tests/test_speculative_compile_floor.py)
speculative_compiles = pytest.mark.skipif(not reusable_static_cache(), reason="needs transformers 5.24 or later")

PROMPT = "Tell me about Richard Feynman"


def probe(tmp_path, name, kernels=("batch-invariant",), backend="aot_eager", inject=False, kv_cache="dynamic",
          model=None):
    config = ProbeConfig(prompt=PROMPT, model=ModelSpec(name=model, inject_variance=inject), batch_sizes=(1, 2, 3),
                         max_new_tokens=10, kernels=kernels, kv_cache=kv_cache, compile_backend=backend,
                         out=str(tmp_path / name))
    result = run_probe(config)
    streams = [json.loads(line) for line in (result.run_dir / "streams.jsonl").read_text().splitlines()]
    return result, {(s["kernels"], s["condition_id"]): s["steps"] for s in streams}


def test_the_compiled_mode_gives_the_eager_modes_bits(tmp_path, tiny_model_dir):
    # the injected batch-variant norm: without the mode (NONDET_TEST_WITHOUT_MODE=1) this case gives several
    # completions, so one distinct completion here is the mode's doing
    model = str(tiny_model_dir)
    compiled, compiled_steps = probe(tmp_path, "compiled", kernels=(FIX_KERNELS,), inject=True, model=model)
    eager, eager_steps = probe(tmp_path, "eager", backend=None, kv_cache="static", kernels=(FIX_KERNELS,), inject=True,
                               model=model)
    mode = compiled.summary["modes"][FIX_KERNELS]
    assert mode["distinct_completions"] == 1 and mode["first_numeric_divergence"] is None
    assert compiled_steps == eager_steps  # tokens, logprob bits, top-k, margins: every condition
    path = compiled.summary["decode_path"]["modes"][FIX_KERNELS]
    assert path["path"] == "compiled" and path["conditions"] == 3 and path["warm_ups"] == 3 and path["warmup_s"] > 0
    env = json.loads((compiled.run_dir / "fingerprint.json").read_text())
    assert env["decode_path"] == "torch.compile (aot_eager), static KV cache"
    assert json.loads((eager.run_dir / "fingerprint.json").read_text())["decode_path"] == "eager, static KV cache"
    assert "decode_path" not in eager.summary
    # aot_eager runs no Inductor pass: the graph census says it saw no graph rather than claiming coverage
    assert compiled.summary["compiled_graph_census"]["graphs_inspected"] == 0
    assert "compiled_graph_census" not in eager.summary


@pytest.mark.slow  # a compiled probe of 3 conditions (29 s on a 2-core AVX2 host)
def test_a_batch_shape_is_warmed_up_once_however_many_conditions_share_it(tmp_path, tiny_model_dir):
    """--trials 2 runs batch size 3 twice (its middle row a filler; batch 1 has none to rotate): the second condition of the
    shape reuses its compiled graph, one warm-up per shape. (Without trials, as many shapes as
    conditions and as many warm-ups: the test above.)"""
    config = ProbeConfig(prompt=PROMPT, model=ModelSpec(name=str(tiny_model_dir)), batch_sizes=(1, 3),
                         max_new_tokens=2, kernels=("default",), trials=2, compile_backend="aot_eager",
                         out=str(tmp_path / "trials"))
    result = run_probe(config)
    path = result.summary["decode_path"]["modes"]["default"]
    assert path["conditions"] == 3 and path["warm_ups"] == 2


@pytest.mark.slow
def test_the_compiled_path_still_finds_injected_variance_and_the_mode_removes_it(tmp_path, default_model_dir):
    result, _ = probe(tmp_path, "inject", kernels=("default", "batch-invariant"), inject=True)
    default, mode = result.summary["modes"]["default"], result.summary["modes"]["batch-invariant"]
    assert default["first_numeric_divergence"] is not None and default["first_numeric_divergence"] <= 1
    assert mode["first_numeric_divergence"] is None and mode["distinct_completions"] == 1
    assert {m["path"] for m in result.summary["decode_path"]["modes"].values()} == {"compiled"}


def test_a_mode_that_cannot_compile_runs_eager_and_says_why(tmp_path, default_model_dir):
    result, steps = probe(tmp_path, "fallback", backend="no_such_backend")
    path = result.summary["decode_path"]["modes"]["batch-invariant"]
    assert path["path"] == "eager" and "no_such_backend" in path["reason"]
    assert len(steps) == 3 and all(len(s) == 10 for s in steps.values())  # every condition ran, eager


def test_a_later_compile_failure_is_an_error_not_a_mixed_comparison():
    paths = DecodePaths("inductor", "cpu")
    paths.warm_up("default", lambda: None)
    paths.measured("default", 0.1)

    def fails():
        raise RuntimeError("graph break storm\ndetails")

    with pytest.raises(NondetError, match="default kernels compiled their first condition but failed on a later one "
                                          r"\(RuntimeError: graph break storm\)"):
        paths.warm_up("default", fails)
    paths.warm_up("batch-invariant", fails)  # a mode's first condition: falls back, no error
    assert paths.as_summary()["modes"]["batch-invariant"]["path"] == "eager"
    assert paths.as_summary()["modes"]["default"]["path"] == "compiled"


def test_a_first_compile_failure_shows_its_traceback_under_nondet_debug(monkeypatch, capsys):
    """The summary keeps one line of why a mode fell back to eager; NONDET_DEBUG=1 prints the whole traceback
    (the control: without it, nothing on stderr)."""
    def fails():
        raise RuntimeError("deep inside Inductor")

    DecodePaths("inductor", "cpu").warm_up("default", fails)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("NONDET_DEBUG", "1")
    DecodePaths("inductor", "cpu").warm_up("default", fails)
    err = capsys.readouterr().err
    assert "Traceback" in err and "in fails" in err and "deep inside Inductor" in err


def test_graph_breaks_in_a_warm_up_are_counted_and_shown():
    """A warm-up whose compiled function breaks the graph (as transformers 5.17's TP modules do) is
    counted per mode and named in the terminal line; the control, the same function without the
    break, counts none."""
    import torch

    from nondet.cli.render import decode_path_lines

    def with_break(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    def without_break(x):
        return x * 2 + 1

    paths = DecodePaths("eager", "cpu")
    for mode, fn in (("default", with_break), ("batch-invariant", without_break)):
        torch._dynamo.reset()
        paths.warm_up(mode, lambda fn=fn: torch.compile(fn, backend="eager")(torch.ones(3)))
    torch._dynamo.reset()
    modes = paths.as_summary()["modes"]
    assert modes["default"]["graph_breaks"] >= 1 and modes["batch-invariant"]["graph_breaks"] == 0
    # the graphs dynamo traced are counted too: the break leaves two, the control one
    assert modes["default"]["graphs_traced"] == 2 and modes["batch-invariant"]["graphs_traced"] == 1, modes
    lines = decode_path_lines(paths.as_summary())
    assert "graph break" in lines[0] and "graph break" not in lines[1]
    assert "2 graphs traced" in lines[0] and "1 graph traced" in lines[1], lines


@pytest.mark.slow
def test_cli_compile_with_inductor_prints_each_modes_path(tmp_path, default_model_dir):
    r = cli_runner.run(["probe", "-p", PROMPT, "-b", "1,2", "-n", "6", "--confirm", "--compile", "--inject-variance",
                        "--out", str(tmp_path / "r")], timeout=600)  # the injected norm: a control on every host
    assert r.returncode == 0, r.stdout + r.stderr
    for mode in ("default", "batch-invariant"):
        assert f"{mode}: torch.compile (inductor), static KV cache; compile + warm-up" in r.stdout, r.stdout
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    graphs = summary["compiled_graph_census"]  # what Inductor compiled under the mode, sorted after tracing
    # inspected here, or taken from the census store where an earlier test of the session (same NONDET_CACHE)
    # compiled the same graph: which one depends on the order pytest-xdist hands the files out
    sorted_graphs = graphs["graphs_inspected"] + graphs.get("graphs_from_store", 0)
    assert sorted_graphs >= 1 and graphs["routed"] > 0 and graphs["uncovered"] == [], graphs
    assert summary["kernel_coverage"]["coverage"] == "invariant"
    assert f"compiled graphs under the mode: {graphs['graphs_inspected']} inspected" in r.stdout, r.stdout
    import os  # Inductor's caches went under NONDET_CACHE (conftest points it at a temp dir)
    assert any((Path(os.environ["NONDET_CACHE"]) / "inductor").iterdir())
    # last, the fix on the compiled path: evidence only where the compiled default kernels differed here
    require_divergence(summary["modes"]["default"], "the compiled demo with its injected norm at bs 2, 6 tokens")
    mode = summary["modes"][FIX_KERNELS]  # --confirm ran both: NONDET_TEST_WITHOUT_MODE=1 reads the default's
    assert (mode["distinct_completions"], mode["first_numeric_divergence"]) == (1, None)


def test_compile_scope_points_inductor_at_nondet_cache_and_restores(monkeypatch, tmp_path):
    import os

    from nondet.probes.core.compiled import INDUCTOR_CACHE_ENV, compile_scope

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("NONDET_CACHE", str(tmp_path))
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    with compile_scope():
        assert os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "inductor")
    assert INDUCTOR_CACHE_ENV not in os.environ
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, default_cache_dir())  # what importing torch's compiler writes
    with compile_scope():
        assert os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "inductor")
    assert os.environ[INDUCTOR_CACHE_ENV] == default_cache_dir()
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, "/somewhere/else")  # the user's own setting is kept
    with compile_scope():
        assert os.environ[INDUCTOR_CACHE_ENV] == "/somewhere/else"


def test_compile_scope_names_one_triton_cache_and_restores(monkeypatch, tmp_path):
    """Triton's folder under NONDET_CACHE for the scope; Inductor's own setting inside it (it sets the
    variable for good when it first compiles a kernel in the process) does not outlive it; the user's kept."""
    import os

    from nondet.probes.core.cache_dir import TRITON_CACHE_ENV
    from nondet.probes.core.compiled import compile_scope

    monkeypatch.setenv("NONDET_CACHE", str(tmp_path))
    monkeypatch.delenv(TRITON_CACHE_ENV, raising=False)
    with compile_scope():
        assert os.environ[TRITON_CACHE_ENV] == str(tmp_path / "triton")
        os.environ[TRITON_CACHE_ENV] = str(tmp_path / "inductor" / "triton" / "0")  # as Inductor would
    assert TRITON_CACHE_ENV not in os.environ
    monkeypatch.setenv(TRITON_CACHE_ENV, "/users/own")
    with compile_scope():
        assert os.environ[TRITON_CACHE_ENV] == "/users/own"
    assert os.environ[TRITON_CACHE_ENV] == "/users/own"


@pytest.mark.parametrize("args", [["--endpoint", "http://127.0.0.1:9"], ["--load", "continuous"],
                                  ["--budget", "30"]])
def test_compile_outside_static_batches_is_one_line_exit_2(tmp_path, args):
    r = cli_runner.run(["probe", "-p", PROMPT, "--compile", *args, "--out", str(tmp_path / "r")], timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--compile decodes static batches" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_gate_compile_judges_the_compiled_path(tmp_path, default_model_dir):
    r = cli_runner.run(["gate", "-p", PROMPT, "-b", "1,2", "-n", "6", "--compile", "--kernels", "batch-invariant", "--out", str(tmp_path / "g")], timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    env = json.loads((tmp_path / "g" / "fingerprint.json").read_text())
    assert env["decode_path"] == "torch.compile (inductor), static KV cache"
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert summary["decode_path"]["modes"]["batch-invariant"]["path"] == "compiled"


def spec_probe(tmp_path, name, backend, kernels=("default", "batch-invariant")):
    config = ProbeConfig(prompt=PROMPT, model=ModelSpec(inject_variance=True), speculative=("ngram:3", "self:2"),
                         max_new_tokens=12, kernels=kernels, compile_backend=backend, out=str(tmp_path / name))
    result = run_probe(config)
    streams = [json.loads(line) for line in (result.run_dir / "streams.jsonl").read_text().splitlines()]
    return result, {(s["kernels"], s["condition_id"]): s["steps"] for s in streams}


@pytest.mark.slow
@speculative_compiles
def test_speculative_decoding_on_the_compiled_path(tmp_path, default_model_dir):
    """--speculative --compile: plain and assisted decoding through the compiled static-cache generate.
    Positive control: the injected batch-variant norm still separates the k+1-row verification passes
    from plain decoding under default kernels; negative: under the mode every form gives plain
    decoding's bits, and the compiled streams equal the mode's eager ones."""
    compiled, steps = spec_probe(tmp_path, "compiled", "aot_eager")
    default, mode = compiled.summary["modes"]["default"], compiled.summary["modes"]["batch-invariant"]
    assert default["first_numeric_divergence"] is not None
    assert mode["first_numeric_divergence"] is None and mode["distinct_completions"] == 1
    paths = compiled.summary["decode_path"]["modes"]
    assert {m["path"] for m in paths.values()} == {"compiled"} and all(m["conditions"] == 3 for m in paths.values())
    env = json.loads((compiled.run_dir / "fingerprint.json").read_text())
    assert env["decode_path"] == "torch.compile (aot_eager), static KV cache"
    _, eager = spec_probe(tmp_path, "eager", None, kernels=("batch-invariant",))
    assert {k: v for k, v in steps.items() if k[0] == "batch-invariant"} == eager


@pytest.mark.slow
@speculative_compiles
def test_a_speculative_condition_is_warmed_up_as_often_as_its_device_needs(tmp_path, default_model_dir, monkeypatch):
    """On CUDA two whole calls warm a speculative condition up (the second was still 1.8-2.6x slower);
    here the CPU is given that count, and every condition gets two warm-up calls before its measured one."""
    from nondet.probes.core import compiled as compiled_path

    monkeypatch.setitem(compiled_path.SPECULATIVE_WARM_CALLS, "cpu", 2)
    warm_ups = []
    original = compiled_path.DecodePaths.warm_up
    monkeypatch.setattr(compiled_path.DecodePaths, "warm_up",
                        lambda self, mode, warm: (warm_ups.append(mode), original(self, mode, warm)))
    result, _ = spec_probe(tmp_path, "warm", "aot_eager", kernels=("default",))
    conditions = result.summary["decode_path"]["modes"]["default"]["conditions"]
    assert conditions == 3 and warm_ups == ["default"] * 2 * conditions
    assert compiled_path.speculative_warm_calls("cuda") == 2 and compiled_path.speculative_warm_calls("mps") == 1
