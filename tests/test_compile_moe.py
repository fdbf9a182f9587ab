"""The mode inside torch.compile on a mixture-of-experts model (a tiny Qwen3-MoE, tests/family_models.py).

Traced, the invariant experts take grouped.combine: no host sync, so the compiled decode step is one
graph with no break (the loop's bincount -> tolist broke it 14 times, warm-up 18 s against 6 s here).
Before that, with the graph broken inside the decoder loop, dynamo ran the loop eagerly inside the
compiled call, and the mode's __torch_function__ was called from code dynamo does not trace. Compiled as a frame of its own it was guarded on `args` but not on `func`: a graph cached
for `h.float()` answered `h.dtype`, the experts returned fp32 and the bf16 decode failed with "expected m1
and m2 to have the same dtype" (`probe --compile` fell back to eager). Backend "aot_eager" (the traced
graphs on the aten kernels eager uses): fast on 2 cores, and exact, so the bits must be the eager mode's.
"""

import pytest
import torch

import family_models as fm
from controls import mode
from nondet.kernels.traced import TracedMode
from nondet.probes.core.compiled import compile_scope, generation_fields

PROMPT = "Tell me about Richard Feynman"


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from nondet.probes.models.default_model import build_tokenizer

    return fm.save_family("qwen3-moe", tmp_path_factory.mktemp("qwen3-moe"), build_tokenizer(512))


def _recording_aot_eager(graphs: list):
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm, example_inputs, **options):  # CompileConfig passes its mode on to the backend
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    return backend


def test_the_compiled_moe_decode_gives_the_eager_modes_bits(moe_dir):
    """What `probe --compile` runs (transformers' compiled generate, the mode in its compiled forwards),
    in bf16, the dtype that failed."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    model = fm.load(moe_dir, torch.bfloat16)
    ids = fm.prompts()[:1]
    graphs = []
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch.no_grad(), compile_scope(), mode(model=model, traceable="compiled_calls"):
        compiled = fm.generate_three(model, ids, **generation_fields(_recording_aot_eager(graphs), "cpu"))
        eager = fm.generate_three(model, ids, cache_implementation="static", disable_compile=True)
    traced = {str(n.target).split(".default")[0] for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert {"nondet.mm", "nondet.mean_sq", "nondet.attention", "nondet.grouped_mm"} <= traced, traced
    assert len(graphs) == 1 and not torch._dynamo.utils.counters["graph_break"], "the decode step broke into graphs"
    assert all(torch.equal(a, b) for a, b in zip(compiled.logits, eager.logits, strict=True))
    # the cause: the mode's __torch_function__ is inlined where dynamo traces, never a cached frame of its own
    assert _debug_get_cache_entry_list(TracedMode.__torch_function__.__code__) == []


@pytest.mark.slow
def test_probe_compile_on_an_moe_decodes_the_mode_compiled(tmp_path, moe_dir):
    """`probe --compile` took the eager fallback on this model; one condition (batch 1, where it failed)
    keeps the compile to one shape."""
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe

    config = ProbeConfig(prompt=PROMPT, model=ModelSpec(name=moe_dir), batch_sizes=(1,), max_new_tokens=3,
                         kernels=("batch-invariant",), compile_backend="aot_eager", out=str(tmp_path / "r"))
    path = run_probe(config).summary["decode_path"]["modes"]["batch-invariant"]
    assert (path["path"], path["reason"], path["conditions"]) == ("compiled", None, 1), path
