"""--tp-invariant's K tree compiled on a GPU: its nodes are the opaque nondet::rounded_add, so the
compiled tree has eager's bits.

Why (4 x H200, 2026-11-28, 8B-width layer, B = 1): the compiled 4-leaf tree (TP1 and TP4) gave other
logits than eager, while TP2 (a 2-leaf subtree, then the collective's one add) gave eager's: Inductor
fused the tree's two levels into one kernel and dropped the bf16 rounding between them. The control
here compiles that formula written out in plain torch, with the Inductor setting the mode uses."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

from nondet.kernels import custom_ops, tp_tree  # noqa: E402


def _parts():
    gen = torch.Generator("cuda").manual_seed(0)
    return [torch.randn(64, 4096, device="cuda", generator=gen).bfloat16() for _ in range(4)]


def _plain(a, b, c, d):
    """pairwise_tree's arithmetic without the opaque nodes."""
    left = (a.float() + b.float()).to(a.dtype)
    right = (c.float() + d.float()).to(a.dtype)
    return (left.float() + right.float()).to(a.dtype)


def test_the_compiled_tree_keeps_every_rounding_and_its_control_fires():
    import torch._inductor.config as inductor_config

    custom_ops.ensure_registered()
    parts = _parts()
    eager = tp_tree.pairwise_tree(parts)
    assert torch.equal(_plain(*parts), eager)
    with inductor_config.patch(emulate_precision_casts=True):  # as traced.traced_scope sets it
        torch._dynamo.reset()
        plain = torch.compile(_plain, fullgraph=True)(*parts)
        torch._dynamo.reset()
        tree = torch.compile(lambda *p: tp_tree.pairwise_tree(list(p)), fullgraph=True)(*parts)
    assert not torch.equal(plain, eager), "control: Inductor kept the rounding between the levels here"
    assert torch.equal(tree, eager)


@pytest.mark.parametrize("m", [1, 8, 64, 512])
@pytest.mark.parametrize("k", [4096, 14336])
def test_the_batched_leaves_have_each_ranks_bits_eager_and_compiled(m, k):
    """TP1 under a tree of 2 runs both leaves as one bmm launch (never the TMA kernel); a TP2 rank runs its
    leaf as one mm (TMA where eligible, split-K at small M). Each leaf must have its rank's bits, or TP1 and
    TP2 part; the whole-K product is the control (it differs)."""
    from nondet.kernels import ops

    gen = torch.Generator("cuda").manual_seed(m + k)
    x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    w = torch.randn(4096, k, device="cuda", generator=gen).bfloat16()
    h = k // 2
    per_rank = tp_tree.pairwise_tree([ops.linear(x[:, :h].contiguous(), w[:, :h].contiguous()),
                                      ops.linear(x[:, h:].contiguous(), w[:, h:].contiguous())])
    chunks = tp_tree.k_chunks(w, 2)
    assert torch.equal(tp_tree.tree_linear(x, w, 2, chunks), per_rank)
    custom_ops.ensure_registered()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: tp_tree.tree_linear(x, w, 2, chunks), fullgraph=True)
    assert torch.equal(compiled(x), per_rank)
    assert not torch.equal(ops.linear(x, w), per_rank)  # control
