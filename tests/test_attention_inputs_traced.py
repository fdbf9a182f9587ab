"""The mask's cut to the keys (ops.attention_inputs) as a trace with the KV length symbolic sees it: its length
is the keys' own symbol. Where it was Min(keys, mask's length), Inductor computed that size in the graph and on
CUDA (torch 2.11, an H200, 2026-11-29) the saved decode step's CUDA-graph partition lost the buffer holding it
("name 'buf0' is not defined" at its first call), so the mode's saved step ran transformers' JIT compile.
The trace is whole (fullgraph): a torch._check with a message built from shapes made dynamo refuse it."""

import torch

from nondet.kernels import ops
from nondet.probes.core import step_batch


def _cut_length(cut) -> str:
    """The length, as the tracer knows it, of the mask `cut(mask, keys)` returns, and the keys' length, with both
    lengths marked symbolic as a saved step marks them (step_batch.symbolic_shapes)."""
    seen = {}

    def recording(gm, example_inputs):
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        cut, keys = (n.meta["example_value"] for n in outputs[:2])
        seen["cut"], seen["keys"] = str(cut.shape[-1]), str(keys.shape[2])
        return gm

    mask = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    keys = torch.zeros(2, 2, 12, 4)
    inputs = {"input_ids": torch.zeros(2, 1, dtype=torch.long), "mask": mask}
    torch._dynamo.reset()
    with step_batch.symbolic_shapes(inputs, with_caches=False):
        torch._dynamo.maybe_mark_dynamic(keys, 0)
        torch._dynamo.maybe_mark_dynamic(keys, 2)
        torch.compile(lambda m, k: (cut(m, k), k + 0), backend=recording, fullgraph=True)(mask, keys)
    return seen["cut"], seen["keys"]


def test_the_masks_cut_has_the_keys_symbolic_length():
    q = torch.zeros(2, 4, 1, 4)
    cut, keys = _cut_length(lambda m, k: ops.attention_inputs(q, k, m, True, False).mask)
    assert cut == keys, (cut, keys)


def test_control_a_bare_cut_has_a_computed_length():
    """The same trace of the cut alone, without what attention_inputs tells the tracer: the hazard is there."""
    cut, keys = _cut_length(lambda m, k: m[..., :k.shape[2]])
    assert cut != keys and "Min" in cut, (cut, keys)


def _leading_hidden(mask: torch.Tensor) -> list:
    """Per row of a (B, 1, Q, S) bool mask, the count of leading columns no query sees: counted one by one."""
    counts = []
    for row in mask[:, 0]:
        seen = row.any(dim=0).tolist()
        counts.append(seen.index(True) if True in seen else len(seen))
    return counts


def test_kv_start_counts_the_leading_columns_no_query_sees():
    """Left padding, a row that sees nothing, holes after the first seen column, a float mask: the count (one
    reduction, where it was a running product) is the count taken column by column."""
    torch.manual_seed(0)
    masks = [torch.rand(3, 1, q, 9) < 0.5 for q in (1, 4)]
    padded = torch.ones(3, 1, 2, 9, dtype=torch.bool)
    padded[0, ..., :4] = False  # left padding
    padded[1] = False  # sees nothing
    padded[2, ..., 5] = False  # a hole after the first seen column
    masks.append(padded)
    for mask in masks:
        want = _leading_hidden(mask)
        assert ops.kv_start_from_mask(mask, 3, 9, "cpu").tolist() == want
        additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
        assert ops.kv_start_from_mask(additive, 3, 9, "cpu").tolist() == want
    assert want == [4, 9, 0]
