"""The mode inside torch.compile (batch_invariant(..., traceable=True)): the traced graph holds the
nondet:: custom ops, not the reductions Inductor would re-derive, and gives the eager mode's bits.

Backends: a recording backend (the dynamo graph as traced) and "aot_eager" (the graph run with
the same aten kernels eager uses), both fast on 2 cores. Inductor's own code for elementwise ops
(rsqrt, silu, cos / sin of the rotary embedding) may round differently from eager, so under
Inductor the compiled path is a path of its own (docs/benchmarks.md); what the mode guarantees
there is that every reduction is its own op with the eager mode's order.
"""

import pytest
import torch

import family_models as fm
from controls import mode
from nondet.kernels import batch_invariant


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return fm.load(fm.save_family("qwen3", tmp_path_factory.mktemp("qwen3")), torch.float32)


def _traced_targets(model, ids, scope) -> set[str]:
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad(), scope():
        torch.compile(model.forward, backend=record)(ids)
    return {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}


def test_the_traced_graph_holds_the_invariant_ops_and_not_the_reductions(qwen3):
    ids = fm.prompts()
    traced = _traced_targets(qwen3, ids, lambda: batch_invariant(model=qwen3, traceable=True))
    assert {"nondet.mm", "nondet.mean_last", "nondet.attention"} <= {t.split(".default")[0] for t in traced}
    assert not any(name in t for t in traced for name in ("linear", "built-in method mean", "softmax")), traced
    # negative control: without traceable the linears and means are plain torch (what Inductor would
    # re-derive); only the attention, which Inductor cannot compile from our Triton source, stays opaque
    plain = _traced_targets(qwen3, ids, lambda: batch_invariant(model=qwen3))
    assert not any("nondet.mm" in t or "nondet.mean" in t for t in plain) and any("linear" in t for t in plain)


def test_compiled_under_the_mode_gives_the_eager_modes_bits_at_every_batch_size(qwen3):
    ids = fm.prompts()
    torch._dynamo.reset()
    compiled = torch.compile(qwen3.forward, backend="aot_eager", dynamic=False)
    with torch.no_grad(), batch_invariant(model=qwen3, traceable=True):
        for b in (1, 3, 4):
            assert torch.equal(compiled(ids[:b]).logits, qwen3(ids[:b]).logits), b


def test_compiled_under_the_mode_a_decode_step_is_batch_invariant_where_the_default_is_not(tmp_path):
    """One token a row (a decode step's shape) through the compiled graph: row 0 alone == row 0 of 4 under the
    mode. The control, on the same model and inputs: the compiled default differs (the injected norm splits
    its sum by rows; this host's own kernels give a prefill the same bits alone and in a batch of 4)."""
    from nondet.kernels.variant import inject_batch_variance

    model = fm.load(fm.save_family("qwen3", tmp_path), torch.float32)
    inject_batch_variance(model)
    step = fm.prompts()[:, :1]
    torch._dynamo.reset()
    compiled = torch.compile(model.forward, backend="aot_eager", dynamic=False)
    with torch.no_grad():
        assert not torch.equal(compiled(step).logits[0], compiled(step[:1]).logits[0])  # the control
        with mode(model=model, traceable=True):
            assert torch.equal(compiled(step).logits[0], compiled(step[:1]).logits[0])


def test_a_bf16_models_norms_read_their_input_once_with_the_eager_modes_bits(tmp_path):
    """In bf16 every norm's mean of squares is one nondet::mean_sq reading the norm's bf16 input
    (squares.py), none a mean over stored fp32 squares, and the compiled logits are the eager mode's."""
    model = fm.load(fm.save_family("qwen3", tmp_path), torch.bfloat16)
    ids = fm.prompts()
    traced = _traced_targets(model, ids, lambda: batch_invariant(model=model, traceable=True))
    means = sorted(t.split(".default")[0] for t in traced if "mean" in t)
    assert means == ["nondet.mean_sq"], traced
    torch._dynamo.reset()
    compiled = torch.compile(model.forward, backend="aot_eager", dynamic=False)
    with torch.no_grad(), batch_invariant(model=model, traceable=True):
        for b in (1, 4):
            assert torch.equal(compiled(ids[:b]).logits, model(ids[:b]).logits), b


def test_a_graph_compiled_under_the_mode_is_not_reused_outside_it(qwen3):
    ids = fm.prompts()
    torch._dynamo.reset()
    compiled = torch.compile(qwen3.forward, backend="aot_eager", dynamic=False)
    with torch.no_grad():
        with batch_invariant(model=qwen3, traceable=True):
            compiled(ids)
        outside = compiled(ids).logits
        assert torch.equal(outside, qwen3(ids).logits)  # default kernels' bits, not the mode's graph


def test_a_masked_prefill_traces_as_one_graph_under_the_mode(qwen3):
    """A one-row prefill with its causal mask must not break the graph: the packed-row search reads
    the mask's contents (nonzero), which under compile broke every layer's graph and synced the host
    (seen on an H100)."""
    ids = fm.prompts()[:1]
    torch._dynamo.reset()
    with torch.no_grad(), batch_invariant(model=qwen3, traceable=True):
        explained = torch._dynamo.explain(qwen3.forward)(ids, attention_mask=torch.ones_like(ids), use_cache=False)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_compiled_calls_trace_generates_forward_under_the_mode_and_leave_its_loop_alone(qwen3):
    """traceable="compiled_calls" (the probe's --compile path): the forward generate compiles is traced
    with the invariant ops, while generate's eager loop around it runs with no torch function mode
    (its ~95 torch calls per step would each pay the mode's Python __torch_function__)."""
    from transformers import CompileConfig, StoppingCriteria

    graphs, stacks = [], []

    def record(gm, example_inputs, **options):  # CompileConfig passes its mode on to the backend
        graphs.append(gm)
        return gm.forward

    class NoteModeStack(StoppingCriteria):  # called by generate's eager loop after every step
        def __call__(self, input_ids, scores, **kwargs):
            stacks.append(torch._C._len_torch_function_stack())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    config = CompileConfig(backend=record, fullgraph=False)
    config._compile_all_devices = True  # transformers compiles on CUDA-like devices only by default
    ids = fm.prompts()[:1]
    torch._dynamo.reset()
    with torch.no_grad(), batch_invariant(model=qwen3, traceable="compiled_calls"):
        out = qwen3.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                             cache_implementation="static", compile_config=config, stopping_criteria=[NoteModeStack()],
                             return_dict_in_generate=True, output_logits=True)
        eager = qwen3.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                               cache_implementation="static", disable_compile=True,
                               return_dict_in_generate=True, output_logits=True)
    traced = {str(n.target).split(".default")[0] for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert graphs and {"nondet.mm", "nondet.mean_last", "nondet.attention"} <= traced, traced
    assert stacks and set(stacks) == {0}, stacks
    assert all(torch.equal(a, b) for a, b in zip(out.logits, eager.logits))  # the eager mode's bits
    # and the patch is gone after the body: transformers' own get_compiled_call again
    from transformers import PreTrainedModel

    assert PreTrainedModel.get_compiled_call.__module__.startswith("transformers")


def test_traceable_takes_only_its_three_values(qwen3):
    with pytest.raises(ValueError, match="traceable"):
        with batch_invariant(model=qwen3, traceable="everywhere"):
            pass


def test_choosing_the_opaque_or_the_triton_op_adds_no_guard_on_a_dynamic_batch():
    """custom_ops.op picks the launch by row count; traced with a symbolic batch, asking rows > 128 made
    dynamo guard on it (B * heads <= 128) and compile again at each threshold the batch crossed. The
    control: the same function with the row count asked the old way compiles twice."""
    from nondet.kernels import custom_ops

    def opaque(x):  # the row count asked without a guard (custom_ops._surely_more_than_decode)
        return custom_ops.op("mean_last", x)(x, True)

    def asked(x):  # the old question: rows > DECODE_ROWS on the symbol
        rows = x.numel() // x.shape[-1]
        return custom_ops.op("mean_last", x)(x, True) + (1.0 if rows > custom_ops.DECODE_ROWS else 0.0)

    custom_ops.ensure_registered()
    for fn, graphs_wanted in ((opaque, 1), (asked, 2)):
        graphs = []

        def count(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=count, dynamic=True)
        for batch in (2, 5, 9, 20):  # x (B, 16 heads, 64): B * 16 crosses 128 between 5 and 9
            x = torch.randn(batch, 16, 64)
            assert torch.equal(compiled(x), fn(x))
        assert len(graphs) == graphs_wanted, (fn.__name__, len(graphs))
    torch._dynamo.reset()
