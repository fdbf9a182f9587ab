"""The mask's cut to the keys (ops.attention_inputs) as a trace with the KV length symbolic sees it.

- Its length is the keys' own symbol. Where it was Min(keys, mask's length), Inductor computed that size in the
  graph and on CUDA (torch 2.11, an H200, 2026-11-29) the saved decode step's CUDA-graph partition lost the
  buffer holding it ("name 'buf0' is not defined" at its first call): the mode's step ran the JIT compile.
- Inductor can split a loop over batch x mask length into the batch and the length. Under the trace's
  backed_size_oblivious a length's range started at 0, the split was not provable, and the mode's step for batch
  2+ failed its compile on that H200 ("CantSplit: s32 not divisible by s1*s32", in _split_iteration_ranges).
The trace is whole (fullgraph): a torch._check with a message built from shapes made dynamo refuse it."""

import torch
from torch._inductor.sizevars import SizeVarAllocator
from torch.utils._sympy.functions import FloorDiv

from nondet.kernels import ops
from nondet.probes.core import step_batch


def _traced(cut) -> dict:
    """What a trace knows of `cut(mask, keys)`'s result and of the keys (fake tensors, sizes symbolic as a saved
    step marks them: step_batch.symbolic_shapes)."""
    seen = {}

    def recording(gm, example_inputs):
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        seen["cut"], seen["keys"] = (n.meta["example_value"] for n in outputs[:2])
        return gm

    mask = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    keys = torch.zeros(2, 2, 12, 4)
    inputs = {"input_ids": torch.zeros(2, 1, dtype=torch.long), "mask": mask}
    torch._dynamo.reset()
    with step_batch.symbolic_shapes(inputs, with_caches=False):
        torch._dynamo.maybe_mark_dynamic(keys, 0)
        torch._dynamo.maybe_mark_dynamic(keys, 2)
        torch.compile(lambda m, k: (cut(m, k), k + 0), backend=recording, fullgraph=True)(mask, keys)
    return seen


def _cut_length(cut) -> tuple[str, str]:
    """The cut's length and the keys' length, as the trace names them."""
    seen = _traced(cut)
    return str(seen["cut"].shape[-1]), str(seen["keys"].shape[2])


def _splits(tensor) -> bool:
    """Whether Inductor can prove that a loop over a (B, ..., L) tensor's batch x length splits into the batch and
    the length: the test simd._split_iteration_ranges makes (torch 2.11 and 2.13) before it splits a range across
    two tile groups (else it raises CantSplit)."""
    batch, length = tensor.shape[0].node.expr, tensor.shape[-1].node.expr
    sizes = SizeVarAllocator(tensor.shape[-1].node.shape_env)
    rows = batch * length
    return sizes.statically_known_gt(rows, batch) or sizes.statically_known_gt(FloorDiv(rows, batch), 1)


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


class _Layer:
    def __init__(self, keys):
        self.keys = keys


class _Cache:
    def __init__(self, keys):
        self.layers = [_Layer(keys)]


def _traced_step(told: bool) -> dict:
    """A decode step's mask arithmetic traced as a saved step traces it (step_batch.symbolic_shapes: batch and
    key lengths symbolic), after step_batch.at_least_two_keys where `told`: the mask and its cut."""
    seen = {}

    def recording(gm, example_inputs):
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        seen["cut"], seen["mask"] = (n.meta["example_value"] for n in outputs[:2])
        return gm

    def step(inputs):
        if told:
            step_batch.at_least_two_keys(inputs)
        keys = inputs["cache"].layers[0].keys
        q = torch.zeros(keys.shape[0], 4, 1, 4)
        return ops.attention_inputs(q, keys, inputs["attention_mask"], True, False).mask, inputs["attention_mask"] | False

    inputs = {"input_ids": torch.zeros(2, 1, dtype=torch.long), "attention_mask": torch.ones(2, 1, 1, 12, dtype=torch.bool),
              "cache": _Cache(torch.zeros(2, 2, 12, 4))}
    torch._dynamo.reset()
    with step_batch.symbolic_shapes(inputs):
        torch.compile(step, backend=recording, fullgraph=True)(inputs)
    return seen


def test_told_the_key_lengths_inductor_can_split_batch_by_mask_length():
    """Both the cut and the mask it was cut from (Inductor found them the same length on the H200)."""
    seen = _traced_step(told=True)
    assert _splits(seen["cut"]) and _splits(seen["mask"])


def test_control_untold_the_split_is_not_provable():
    seen = _traced_step(told=False)
    assert not _splits(seen["mask"]) and not _splits(seen["cut"])


def _saved_at_batch_two_takes_batch_one() -> bool | str:
    """attention_inputs' mask and leading hidden columns, traced and saved as a decode step is (torch's AOT compile,
    Inductor, batch and key lengths symbolic) on a batch of 2, then called on a batch of 1: True where the saved
    function's guards take it, else the guard that refused it."""
    from nondet.probes.core.aot_step import aot_compilable, aot_compile
    from nondet.probes.core.guard_refusal import failed_part

    def step(q, keys, mask):
        step_batch.at_least_two_keys({"mask": mask})
        found = ops.attention_inputs(q, keys, mask, True, False)
        return found.mask, found.kv_start

    def inputs(batch: int) -> dict:
        return {"q": torch.zeros(batch, 4, 1, 8), "keys": torch.zeros(batch, 2, 10, 8),
                "mask": torch.ones(batch, 1, 1, 12, dtype=torch.bool)}

    two = inputs(2)
    torch._dynamo.reset()
    with step_batch.symbolic_shapes({"input_ids": torch.zeros(2, 1), "mask": two["mask"]}, with_caches=False):
        for tensor in (two["q"], two["keys"]):
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
        torch._dynamo.maybe_mark_dynamic(two["keys"], 2)
        saved = aot_compile(aot_compilable(step, {"backend": "inductor", "fullgraph": True}), ((), two))
    one = inputs(1)
    try:
        saved(**one)
    except RuntimeError as exc:
        return failed_part(str(exc), one) or str(exc)[:200]
    return True


def test_a_step_saved_at_batch_two_takes_batch_one():
    """The cut is copied in a trace (ops._cut), so Inductor's reductions over it keep the batch symbolic: one
    saved function for every batch size, where each kernels mode compiled two on an H200 (torch 2.11)."""
    assert _saved_at_batch_two_takes_batch_one() is True


def test_control_the_cut_read_in_place_keeps_batch_one_apart(monkeypatch):
    monkeypatch.setattr(ops, "_cut", lambda mask, s: mask[..., :s])
    assert _saved_at_batch_two_takes_batch_one() == "2 <= L['mask'].size()[0]"
