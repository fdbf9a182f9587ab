"""An RMSNorm's mean of squares under the traced mode (squares.py): the written patterns become one
nondet::mean_sq reading the norm's input, anything else stays a mean over the stored squares, and a
write in between keeps the squares that were taken.

Each case runs eagerly under the mode and compiled (dynamo, a recording backend, fullgraph): the
values must be those of plain torch either way; the graph tells which op took the mean.
"""

import pytest
import torch

from nondet.kernels import squares
from nondet.kernels.traced import traced_scope

NORM = frozenset({"norm"})


def _traced(fn, x):
    """(eager result under the mode, compiled result, the graphs dynamo traced)."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad(), traced_scope(NORM):
        eager = fn(x.clone())
        compiled = torch.compile(fn, backend=record, fullgraph=True)(x.clone())
    return eager, compiled, graphs


def _run(fn, x):
    """(eager result under the mode, compiled result, the nondet ops in the compiled graph)."""
    eager, compiled, graphs = _traced(fn, x)
    ops = [str(n.target).split(".default")[0] for g in graphs for n in g.graph.nodes
           if n.op == "call_function" and "nondet" in str(n.target)]
    return eager, compiled, ops


def _x(dtype=torch.bfloat16):
    return (torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)


FUSED = {
    "llama: to(float32).pow(2)": lambda x: x.to(torch.float32).pow(2).mean(-1, keepdim=True),
    "gemma: float().square()": lambda x: x.float().square().mean(-1, keepdim=True),
    "torch.pow, dim=-1 by keyword": lambda x: torch.pow(x.float(), 2).mean(dim=-1, keepdim=True),
    "pow(2.0)": lambda x: x.float().pow(2.0).mean(-1),
}


@pytest.mark.parametrize("name", FUSED)
def test_a_norms_mean_of_squares_is_one_op_with_plain_values(name):
    fn = FUSED[name]
    x = _x()
    eager, compiled, ops = _run(fn, x)
    assert ops == ["nondet.mean_sq"], ops
    plain = fn(x)  # no mode: aten's pow and mean
    assert eager.dtype == compiled.dtype == torch.float32 and eager.shape == plain.shape
    torch.testing.assert_close(eager, plain, rtol=1e-6, atol=0)
    assert torch.equal(compiled, eager)


def _write_to_source(x):
    h = x.to(torch.float32)
    sq = h.pow(2)
    x.add_(1)  # after the squares were taken: the mean must not re-read x
    return sq.mean(-1, keepdim=True)


def _write_to_squares(x):
    sq = x.float().pow(2)
    sq[..., 0] = 0.0
    return sq.mean(-1)


def _write_to_upcast(x):
    h = x.float()
    h.mul_(2)  # before the square: the squares are of 2x, not of x
    return h.pow(2).mean(-1)


def _write_by_out(x):
    h = x.float()
    sq = h.pow(2)
    torch.add(sq, 1.0, out=sq)
    return sq.mean(-1)


NOT_FUSED = {
    "cube": lambda x: x.float().pow(3).mean(-1),
    # not recognised (no norm in transformers writes it): with Tensor.__pow__ among the tagged functions,
    # dynamo's guard on that lookup failed on the frame that made it (torch 2.13)
    "operator **": lambda x: (x.float() ** 2).mean(-1),
    "squares of bf16 (rounded to bf16)": lambda x: x.pow(2).mean(-1),
    "squares of a computed fp32 tensor (not exact)": lambda x: torch.square(x.float() + 1).mean(-1),
    "mean over another dim": lambda x: x.float().pow(2).mean(0),
    "a tensor exponent": lambda x: x.float().pow(torch.tensor(2.0)).mean(-1),
    "write to the source": _write_to_source,
    "write to the squares": _write_to_squares,
    "write to the upcast": _write_to_upcast,
    "write by out=": _write_by_out,
}


@pytest.mark.parametrize("name", NOT_FUSED)
def test_other_means_and_written_tensors_keep_the_stored_squares(name):
    fn = NOT_FUSED[name]
    x = _x()
    eager, compiled, ops = _run(fn, x)
    assert "nondet.mean_sq" not in ops, ops
    plain = fn(x.clone())
    torch.testing.assert_close(eager, plain, rtol=1e-6, atol=0)
    torch.testing.assert_close(compiled, plain, rtol=1e-6, atol=0)


def test_an_fp32_models_norm_keeps_the_stored_squares():
    """x.to(float32) is x itself for fp32 x, and fp32 squares round: the kernel could not fuse them
    without changing bits (triton_rows._mean_sq_kernel), so the mean stays over aten's squares."""
    fn = FUSED["llama: to(float32).pow(2)"]
    x = _x(torch.float32)
    eager, compiled, ops = _run(fn, x)
    assert ops == ["nondet.mean_last"], ops
    assert torch.equal(eager, compiled)
    torch.testing.assert_close(eager, fn(x), rtol=1e-6, atol=0)


@pytest.mark.parametrize("fn", [_write_to_source, _write_to_upcast, _write_by_out])
def test_without_the_write_marks_the_mean_would_read_the_wrong_tensor(fn, monkeypatch):
    """The control: with writes unmarked, these cases fuse and give other values, so the marks are
    what keeps them right."""
    monkeypatch.setattr(squares, "mutated", lambda t: False)
    x = _x()
    _, compiled, ops = _run(fn, x)
    assert ops == ["nondet.mean_sq"] and not torch.allclose(compiled, fn(x.clone()))


def test_the_traced_graph_of_a_norm_has_no_squares_left_to_write():
    """What the op saves: in the graph Inductor gets, the squares are dead once the mean reads x."""
    def rms_norm(x):
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        return (h * torch.rsqrt(variance + 1e-6)).to(x.dtype)

    _, _, graphs = _traced(rms_norm, _x())
    gm = graphs[0]
    gm.graph.eliminate_dead_code()
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert any("mean_sq" in t for t in targets) and not any("pow" in t for t in targets), targets


def test_at_run_time_the_mode_makes_no_tags():
    """Outside a trace (cudagraph trees' bookkeeping inside a compiled call, a frame dynamo skipped) the
    mode passes torch functions through: no tags and no marks, whose only reader is a trace; the mean
    then takes the stored squares, mean_sq's bits."""
    x = _x()
    with torch.no_grad(), traced_scope(NORM):
        h = x.float()
        sq = h.pow(2)
        x.add_(0)
        mean = sq.mean(-1, keepdim=True)
    assert not any(hasattr(t, name) for t in (h, sq, x) for name in (squares.UPCAST_OF, squares.SQUARE_OF,
                                                                     squares.MUTATED))
    torch.testing.assert_close(mean, x.float().pow(2).mean(-1, keepdim=True), rtol=1e-6, atol=0)


def _guard_names(ops: frozenset, fn, x) -> list[str]:
    names = []
    torch._dynamo.reset()
    with torch.no_grad(), traced_scope(ops):
        torch._dynamo.optimize("eager", guard_export_fn=lambda guards: names.extend(g.name for g in guards))(fn)(x)
    return names


def test_a_compiled_graph_guards_the_modes_op_classes_not_its_lookup_tables():
    """The routes, taggers and in-place functions are looked up at trace time and kept as constants:
    the graph guards the mode's op classes (a graph traced for other classes is not reused), not each
    key of those tables (252 guards for the in-place functions alone, checked on every call)."""
    def fn(x):
        h = x.float()
        mean = h.pow(2).mean(-1, keepdim=True)
        x.add_(1)
        return torch.nn.functional.linear(h, torch.ones(4, 64)), mean

    names = _guard_names(frozenset({"norm", "matmul"}), fn, _x()[0])
    on_mode = sorted({n.split(").", 1)[1] for n in names if "function_mode_stack_at" in n})
    assert on_mode == ["ops", "tags"], on_mode
    counts = []

    def count(gm, example_inputs):
        counts.append(1)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=count)
    for ops in ({"norm", "matmul"}, {"norm", "matmul"}, {"norm"}):
        with torch.no_grad(), traced_scope(frozenset(ops)):
            compiled(_x()[0])
    assert len(counts) == 2  # the same classes reuse the graph; other classes compile their own
