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
