"""The mode inside torch.compile on families whose matmuls are not F.linear: GPT-2's Conv1D calls
torch.addmm, Falcon's linear is `x @ weight.T` on 3-D activations. The traced mode routes both to the
nondet:: ops; before, Inductor compiled them as aten::addmm / aten::mm with its default kernels and the
graph census refused `probe --compile` on these models. Backend aot_eager (exact, fast on 2 cores): the
compiled decode must give the eager mode's bits, and no default matmul may be left in a graph.
"""

import pytest
import torch

import family_models as fm
from controls import mode
from nondet.probes.core.compiled import compile_scope, generation_fields

DEFAULT_MATMULS = {"aten.mm", "aten.addmm", "aten.bmm"}


def _recording_aot_eager(graphs: list):
    from torch._functorch.aot_autograd import aot_module_simplified

    def record(gm, example_inputs):
        graphs.append(gm)  # the aten graph aot_eager runs
        return gm

    def backend(gm, example_inputs, **options):  # CompileConfig passes its mode on to the backend
        return aot_module_simplified(gm, example_inputs, fw_compiler=record)

    return backend


@pytest.mark.parametrize("family", ["gpt2", "falcon"])
def test_the_compiled_decode_routes_every_matmul_and_gives_the_eager_modes_bits(family, tmp_path):
    model = fm.load(fm.save_family(family, tmp_path / family), torch.float32)
    ids = fm.prompts()[:1]
    graphs = []
    torch._dynamo.reset()
    with torch.no_grad(), compile_scope(), mode(model=model, traceable="compiled_calls"):
        compiled = fm.generate_three(model, ids, **generation_fields(_recording_aot_eager(graphs), "cpu"))
        eager = fm.generate_three(model, ids, cache_implementation="static", disable_compile=True)
    assert graphs, "nothing was compiled"
    targets = {str(n.target).removesuffix(".default") for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert not targets & DEFAULT_MATMULS, targets & DEFAULT_MATMULS
    assert {"nondet.mm", "nondet.addmm"} & targets
    assert all(torch.equal(a, b) for a, b in zip(compiled.logits, eager.logits, strict=True))
