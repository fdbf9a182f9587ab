"""`nondet probe --tp 1,2 --compile` on the CPU (gloo, Inductor): every rank decodes on transformers'
compiled path through the static probe's decoder (probes/static/decoder.py).

The positive control fires on any host (the injected batch-variant norm: default kernels' bits differ
at both degrees); the negative: the mode at TP2, compiled, is one completion with the same bits at every
batch size, its collective ran, and the graph census found no reduction it does not route (the
collectives sorted: the mode's all-gathers copy, the vocab-parallel embedding's sum is exact).
merged_decode (pure) is checked on its own, in the fast selection.
"""

import json
import os

import pytest

import cli_runner
from controls import FIX_KERNELS, WITHOUT_MODE
from nondet.probes.tp.source import merged_decode


@pytest.fixture(scope="module")
def compiled_tp_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("tpc") / "run"
    r = cli_runner.run(("probe", "--tp", "1,2", "--compile", "--model", str(tiny_model_dir), "--prompt",
                        "Tell me about Richard Feynman", "--batch-sizes", "1,2", "--max-new-tokens", "4",
                        *(("--kernels", "default") if WITHOUT_MODE else ("--confirm",)),
                        "--inject-variance", "--out", str(out), "--json"), env=dict(os.environ), timeout=600)
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


@pytest.mark.slow
def test_every_degree_decodes_compiled_under_both_kernels(compiled_tp_run):
    out, summary = compiled_tp_run
    modes = summary["decode_path"]["modes"]
    assert {m: e["path"] for m, e in modes.items()} == {"default": "compiled", "batch-invariant": "compiled"}
    assert all(e["conditions"] == 4 for e in modes.values())  # 2 conditions at each of 2 degrees
    # one graph per shape: transformers 5.2x's TP modules trace without a break (5.17's break at each one)
    assert all(e["graph_breaks"] == 0 for e in modes.values()), modes
    assert set(summary["tensor_parallel"]["decode_paths"]) == {"1", "2"}
    assert "torch.compile" in json.loads((out / "fingerprint.json").read_text())["decode_path"]


@pytest.mark.slow
def test_positive_control_fires_compiled_at_both_degrees(compiled_tp_run):
    _, summary = compiled_tp_run
    by_degree = summary["tensor_parallel"]["modes"]["default"]["by_degree"]
    assert all(r["first_numeric_divergence"] in (0, 1) for r in by_degree), by_degree


@pytest.mark.slow
def test_the_compiled_mode_at_tp2_is_one_completion_and_its_graphs_are_covered(compiled_tp_run):
    out, summary = compiled_tp_run
    tp2 = next(r for r in summary["tensor_parallel"]["modes"][FIX_KERNELS]["by_degree"] if r["tp"] == 2)
    assert tp2["distinct_completions"] == 1 and tp2["first_numeric_divergence"] is None
    census = summary.get("compiled_graph_census") or {}
    # a graph per degree, sorted as Inductor compiled it or, compiled by an earlier test under the session's
    # NONDET_CACHE (one graph for every batch size and length since core/step_batch.py), read from the store
    assert census["graphs_inspected"] + census["graphs_from_store"] >= 2, census
    assert census["routed"] > 0 and census["uncovered"] == []
    assert not any(op.startswith("_c10d") for op in census["unreviewed"]), census
    groups = json.loads((out / "fingerprint.json").read_text())["tensor_parallel"]["groups"]
    assert next(g for g in groups if g["degree"] == 2)["invariant_all_reduce_calls"] > 0


@pytest.mark.slow
def test_the_mode_traces_one_graph_per_degree_for_both_batch_sizes(compiled_tp_run, tiny_model_dir, tmp_path):
    """Every rank compiles with the batch symbolic from the first trace (core/dynamic_jit.py) and the
    vocab-parallel embedding on local shards (tp/local_params.py: DTensor's embedding guarded on batch < 2):
    batch 1 and 2 share the mode's graph at each degree. The control, transformers' own JIT compile
    (NONDET_PRECOMPILE=0) on the same case, traces batch 1 apart: two graphs a degree."""
    _, summary = compiled_tp_run
    assert summary["decode_path"]["modes"][FIX_KERNELS]["graphs_traced"] == 2, summary["decode_path"]
    r = cli_runner.run(("probe", "--tp", "1,2", "--compile", "--model", str(tiny_model_dir), "--prompt",
                        "Tell me about Richard Feynman", "--batch-sizes", "1,2", "--max-new-tokens", "4",
                        "--kernels", FIX_KERNELS, "--inject-variance", "--out", str(tmp_path / "run"), "--json"),
                       env={**os.environ, "NONDET_PRECOMPILE": "0"}, timeout=600)
    assert r.returncode == 0, r.stderr
    control = json.loads(r.stdout)["decode_path"]["modes"][FIX_KERNELS]
    assert control["graphs_traced"] == 4, control


def _path(path="compiled", reason=None, warm=1.0, measured=0.5, n=2, breaks=1, graphs=1):
    return {"path": path, "reason": reason, "warmup_s": warm, "measured_s": measured, "conditions": n,
            "warm_ups": n, "graph_breaks": breaks, "graphs_traced": graphs}


def test_merged_decode_adds_the_degrees_and_keeps_a_fallback_with_its_degree():
    census = {"graphs_inspected": 1, "routed": 3, "row_independent": 5, "unreviewed": {"aten::x": 1},
              "uncovered": [{"module": "m", "op": "aten::cumsum", "calls": 1}]}
    by_degree = {
        1: {"decode_path": {"compiled": "torch.compile", "modes": {"default": _path()}}, "compiled_graph_census": census},
        2: {"decode_path": {"compiled": "torch.compile", "modes": {"default": _path("eager", "Unsupported: x")}},
            "compiled_graph_census": census},
    }
    doc = merged_decode(by_degree)
    entry = doc["decode_path"]["modes"]["default"]
    assert entry == {"path": "eager", "reason": "TP2: Unsupported: x", "warmup_s": 2.0, "measured_s": 1.0,
                     "conditions": 4, "warm_ups": 4, "graph_breaks": 2, "graphs_traced": 2}
    assert doc["compiled_graph_census"]["graphs_inspected"] == 2 and doc["compiled_graph_census"]["routed"] == 6
    assert doc["compiled_graph_census"]["uncovered"] == [{"module": "m", "op": "aten::cumsum", "calls": 2}]
    assert doc["compiled_graph_census"]["unreviewed"] == {"aten::x": 2}
    assert merged_decode({}) == {}


def test_a_tp_models_compiled_step_skips_only_the_guards_on_its_fixed_layout():
    """DTensor specs and the cells of TP forward wrappers are dropped; what tells the kernels modes apart
    (hooks, globals such as F.linear, the torch function mode stack, a forward wrapper of our own) and
    the inputs stay guarded. A model without DTensors gets no filter, and transformers' default mode."""
    from types import SimpleNamespace as Entry

    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from nondet.probes.core import compiled

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    mesh = object.__new__(DeviceMesh)  # a closure cell of torch.distributed's kind; never used

    def tp_forward(x, _mesh=mesh):
        return x

    def our_forward(x, _scope=len):
        return x

    model[0].forward = (lambda f, m: lambda x: f(x) if m else x)(tp_forward, mesh)  # closes over a DeviceMesh
    model[1].forward = (lambda f, s: lambda x: f(x) if s else x)(our_forward, len)  # closes over ours
    keep = compiled._layout_filter(model)
    path = "L['args'][0]._modules['{}'].forward.__closure__[1].cell_contents"
    entries = [Entry(guard_type="DTENSOR_SPEC_MATCH", name="L['args'][0]._modules['0']._parameters['weight']._spec"),
               Entry(guard_type="ID_MATCH", name=path.format("0")),
               Entry(guard_type="ID_MATCH", name=path.format("1")),
               Entry(guard_type="EMPTY_NN_MODULE_HOOKS_DICT", name="L['args'][0]._modules['0']._forward_hooks"),
               Entry(guard_type="ID_MATCH", name="G['__import_torch_dot_nn_dot_functional'].linear"),
               Entry(guard_type="TORCH_FUNCTION_MODE_STACK", name=""),
               Entry(guard_type="TENSOR_MATCH", name="L['kwargs']['input_ids']")]
    assert keep(entries) == [False, False, True, True, True, True, True]
    assert compiled.tp_layout_guard_filter(model) is None  # no DTensor parameter: not a TP model
    tp = compiled.generation_fields("inductor", "cuda", keep)["compile_config"]
    assert tp.mode is None and tp.options == {"guard_filter_fn": keep, "triton.cudagraphs": True}
    one = compiled.generation_fields("inductor", "cuda")["compile_config"]
    assert one.mode == "reduce-overhead" and one.options is None  # one GPU: transformers' default, every guard
