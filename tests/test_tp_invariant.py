"""TP-invariance: under the mode with --tp-invariant, TP1 and TP2 give the same bits.

Without the tree the mode is batch-invariant at each degree but TP2 still differs from TP1 from
the first step (each rank rounds its K slice's partial before the all-reduce): the positive
control, structural, so it holds on any host. With the tree every degree computes the same
pairwise K reduction (kernels/tp_tree.py): the negative control.
"""

import json
import os

import pytest
import torch

from nondet.kernels import tp_tree
import cli_runner
from controls import FIX_KERNELS


def nondet(*args):
    return cli_runner.run(args, env=dict(os.environ), timeout=300)


def tp_versus(tmp_path, *extra, model=None) -> tuple[dict, dict]:
    out = tmp_path / ("tree" if "--tp-invariant" in extra else "plain")
    model_args = ("--model", str(model)) if model else ()
    r = nondet("probe", "--tp", "1,2", *model_args, "--prompt", "Tell me about Richard Feynman", "--batch-sizes", "1,2",
               "--max-new-tokens", "6", "--kernels", FIX_KERNELS, "--out", str(out), *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    fingerprint = json.loads((out / "fingerprint.json").read_text())
    (versus,) = summary["tensor_parallel"]["modes"][FIX_KERNELS]["vs_reference"]
    return versus, fingerprint["tensor_parallel"]


@pytest.mark.slow
def test_the_mode_alone_leaves_tp2_off_tp1_and_the_tree_makes_them_bitwise_equal(tmp_path, default_model_dir):
    plain, fp_plain = tp_versus(tmp_path)
    assert (plain["tp"], plain["against"]) == (2, 1)
    assert not plain["bitwise_equal"] and plain["first_numeric_divergence"] == 0  # positive control
    tree, fp_tree = tp_versus(tmp_path, "--tp-invariant")
    assert tree["bitwise_equal"] and tree["first_token_divergence"] is None  # negative control
    assert fp_plain["tp_invariant_leaves"] is None and fp_tree["tp_invariant_leaves"] == 2


@pytest.mark.slow
def test_compiled_the_tree_makes_tp1_and_tp2_bitwise_equal_with_every_linear_routed(tmp_path, tiny_model_dir):
    """--compile: the tree's stand-in for F.linear must reach the mode's ops in the graph (a refusal by
    the compiled census, exit 3, before tp_tree routed the calls it passes on); control as above."""
    plain, _ = tp_versus(tmp_path, "--compile", model=tiny_model_dir)
    assert not plain["bitwise_equal"] and plain["first_numeric_divergence"] == 0  # positive control
    tree, fp_tree = tp_versus(tmp_path, "--compile", "--tp-invariant", model=tiny_model_dir)
    assert tree["bitwise_equal"] and tree["first_token_divergence"] is None  # negative control
    summary = json.loads((tmp_path / "tree" / "summary.json").read_text())
    assert summary["decode_path"]["modes"][FIX_KERNELS]["path"] == "compiled"
    assert summary["compiled_graph_census"]["uncovered"] == [] and fp_tree["tp_invariant_leaves"] == 2


@pytest.mark.parametrize("args", [["--tp-invariant"], ["--tp", "1,3", "--tp-invariant"]])
def test_tp_invariant_needs_power_of_two_degrees(tmp_path, args):
    r = nondet("probe", "--prompt", "x", *args, "--out", str(tmp_path / "r"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "--tp-invariant needs --tp degrees that are powers of 2" in r.stderr


def test_a_ranks_subtree_then_the_pairwise_reduce_is_the_whole_tree():
    """What TP2 computes (each rank: its half of K as a 2-leaf subtree; then the roots pairwise)
    equals the 4-leaf tree of TP1 bit for bit; one plain product does not (bf16, K = 512)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 512, generator=gen).bfloat16()
    w = torch.randn(64, 512, generator=gen).bfloat16()
    whole = tp_tree.tree_linear(x, w, 4)
    halves = [tp_tree.tree_linear(x[:, i * 256:(i + 1) * 256], w[:, i * 256:(i + 1) * 256], 2) for i in (0, 1)]
    assert torch.equal(tp_tree.pairwise_tree(halves), whole)
    assert not torch.equal(torch.nn.functional.linear(x, w), whole)
    with pytest.raises(ValueError, match="does not split into 3 equal chunks"):
        tp_tree.tree_linear(x, w, 3)


@pytest.mark.parametrize("rows", [(1, 1), (2, 3), (5,), (0, 4)])
def test_the_batched_leaves_have_the_bits_of_one_product_per_rank(rows):
    """TP1's leaves run as one batched launch; each must have the bits of the product a rank computes on
    its own shard (one mm on a contiguous input and weight), so the tree of those per-rank products is TP1's
    output bit for bit; the whole-K product (the control) is not."""
    from nondet.kernels import ops

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(*rows, 1024, generator=gen).bfloat16()
    w = torch.randn(96, 1024, generator=gen).bfloat16()
    per_rank = [ops.linear(x[..., i * 512:(i + 1) * 512].contiguous(), w[:, i * 512:(i + 1) * 512].contiguous())
                for i in (0, 1)]
    tree = tp_tree.tree_linear(x, w, 2)
    assert tree.shape == (*rows, 96)
    assert torch.equal(tree, tp_tree.pairwise_tree(per_rank))
    assert torch.equal(tree, tp_tree.tree_linear(x, w, 2, tp_tree.k_chunks(w, 2)))  # chunks made ahead
    assert not torch.equal(tree, ops.linear(x, w)) or not tree.numel()  # control (no rows: nothing to differ)


def test_tree_linears_hooks_only_the_row_parallel_modules_and_restores_f_linear(default_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.bfloat16)
    original = torch.nn.functional.linear
    with pytest.raises(RuntimeError, match="boom"):
        with tp_tree.tree_linears(model, 2) as names:
            assert torch.nn.functional.linear is not original
            assert names == [f"model.layers.{i}.{m}" for i in range(4) for m in ("self_attn.o_proj", "mlp.down_proj")]
            raise RuntimeError("boom")
    assert torch.nn.functional.linear is original
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


_LISTED_AFTER_A_TREE_SCOPE = """
import sys, itertools, torch
from torch._dynamo.variables import torch as dynamo_torch
from nondet.kernels import tp_tree
if sys.argv[1] == "control":
    tp_tree.overridable_functions_listed = lambda: None


class Model(torch.nn.Module):  # one row-parallel linear by its tp plan: what tree_linears needs of a model
    tp_plan = {"proj": "rowwise"}

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.proj = torch.nn.Linear(8, 8)


with tp_tree.tree_linears(Model(), 2):
    listed = set(itertools.chain.from_iterable(torch.overrides.get_overridable_functions().values()))
    dynamo_listed = dynamo_torch.get_overridable_functions()
print(torch._C._nn.linear in listed, torch._C._nn.linear in dynamo_listed)
"""


def test_a_tree_scope_first_in_a_process_leaves_the_builtin_linear_overridable():
    """torch and dynamo list the overridable functions once per process, reading F.linear: listed inside the
    first tree scope, the stand-in replaced the builtin for good, and a later compiled mode left F.linear
    unrouted (the builtin linear in its graph; found as tests/test_compile_moe.py failing after the traced
    chunks test in one process). The control lists them inside the scope, as before. Fresh processes, side
    by side."""
    import subprocess
    import sys

    runs = {case: subprocess.Popen([sys.executable, "-c", _LISTED_AFTER_A_TREE_SCOPE, case], text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
            for case in ("fixed", "control")}
    listed = {}
    for case, run in runs.items():
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-2000:]
        listed[case] = out.split()[-2:]
    assert listed == {"fixed": ["True", "True"], "control": ["False", "False"]}


def test_the_k_chunks_are_made_once_per_module_with_the_bits_of_chunks_made_per_call(default_model_dir, monkeypatch):
    """TP1 under a tree of 2: each row-parallel weight's K halves are copied once and held (a later scope
    reuses them; a weight written in place gets new ones), not made at every call; the control makes them
    at every call (the path before) and gives the same logits."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.bfloat16)
    ids = torch.tensor([[5, 9, 2, 7, 11]])
    made, real = [], tp_tree.k_chunks
    monkeypatch.setattr(tp_tree, "k_chunks", lambda weight, leaves: made.append(weight.shape) or real(weight, leaves))

    def logits_of_three_forwards():
        made.clear()
        with torch.no_grad(), tp_tree.tree_linears(model, 2):
            return [model(ids).logits for _ in range(3)]

    once = logits_of_three_forwards()
    assert len(made) == 8  # 4 layers x (o_proj, down_proj), at the scope's start
    assert all(torch.equal(a, b) for a, b in zip(once, logits_of_three_forwards())) and made == []  # held
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.0)  # an in-place write: its chunks are made again
    logits_of_three_forwards()
    assert len(made) == 1
    monkeypatch.setattr(tp_tree, "held_chunks", lambda weight, leaves: None)  # none held: made at every call
    per_call = logits_of_three_forwards()
    assert len(made) == 3 * 8  # the control: the chunks made again at every call
    assert all(torch.equal(a, b) for a, b in zip(once, per_call))
    assert not torch.equal(once[0], model(ids).logits)  # the tree was on: not the plain product's logits


def test_traced_the_chunks_are_graph_inputs_not_copies_made_at_every_step(default_model_dir, monkeypatch):
    """Under torch.compile the held chunks enter the graph as static inputs, as parameters do (CUDA graphs
    neither copy them at each replay nor capture again): the graph copies no weight (8 fewer copies: one
    per weight). The control, no chunks held, traces the copies."""
    from transformers import AutoModelForCausalLM

    from nondet.kernels import batch_invariant

    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.bfloat16).eval()
    ids = torch.tensor([[5, 9, 2, 7, 11]])

    def copies_traced() -> int:
        graphs = []

        def backend(gm, _inputs):
            graphs.append(gm)
            return gm.forward

        torch._dynamo.reset()
        with torch.no_grad(), batch_invariant(model=model, traceable=True), tp_tree.tree_linears(model, 2):
            torch.compile(model, backend=backend)(ids)
        return sum("contiguous" in str(n.target) for gm in graphs for n in gm.graph.nodes)

    once = copies_traced()
    held = [chunks for _, (_, chunks) in tp_tree._HELD.items()]
    assert len(held) >= 8 and all(getattr(c, "_dynamo_static_input_type", None) for c in held)  # static, as params
    monkeypatch.setattr(tp_tree, "held_chunks", lambda weight, leaves: None)
    assert copies_traced() == once + 8


def _compiled_tree(fn, parts):
    """fn(*parts) through torch.compile (Inductor, no FX graph cache), with the ops of the graph dynamo
    handed it."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    from nondet.kernels import custom_ops

    custom_ops.ensure_registered()
    targets = []

    def backend(gm, inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return compile_fx(gm, inputs)

    torch._dynamo.reset()
    with inductor_config.patch(emulate_precision_casts=True, fx_graph_cache=False):  # as the mode sets it
        return torch.compile(fn, backend=backend, fullgraph=True)(*parts), targets


@pytest.fixture
def inductor_dropping_round_trips():
    """Inductor as older releases ran it: its pattern pass rewrote x.to(bf16).to(float32) as x.to(float32),
    dropping the bf16 rounding whatever the dtypes (torch 2.13 keeps a narrower intermediate). On an H200
    with torch 2.11 a compiled 4-leaf tree lost eager's bits this way, we read."""
    from torch._inductor.fx_passes import joint_graph

    joint_graph.lazy_init()
    entries = [e for group in joint_graph.patterns.patterns.values() for e in group
               if getattr(e, "handler", None) is joint_graph.pointless_convert]
    assert entries, "torch's pointless_convert pattern moved: this fixture needs updating"

    def drop_round_trip(match, arg, dtype1, dtype2):
        node = match.output_node()
        direct = match.graph.call_function(torch.ops.prims.convert_element_type.default, (arg, dtype2))
        direct.meta.update(node.meta)
        node.replace_all_uses_with(direct)
        match.erase_nodes()

    for entry in entries:
        entry.handler = drop_round_trip
    try:
        yield
    finally:
        for entry in entries:
            entry.handler = joint_graph.pointless_convert
        torch._dynamo.reset()


def _plain_tree(a, b, c, d):
    """pairwise_tree's arithmetic for 4 parts written out in torch, without its opaque nodes."""
    left = (a.float() + b.float()).to(a.dtype)
    right = (c.float() + d.float()).to(a.dtype)
    return (left.float() + right.float()).to(a.dtype)


def test_the_compiled_tree_keeps_eagers_bits_where_inductor_drops_round_trips(inductor_dropping_round_trips):
    """Traced, each node of the K tree is the opaque nondet::rounded_add, so no pass can fuse two levels
    and skip the rounding between them. Control: the same arithmetic in plain torch loses eager's bits."""
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(64, 512, generator=gen).bfloat16() for _ in range(4)]
    eager = tp_tree.pairwise_tree(parts)
    assert torch.equal(_plain_tree(*parts), eager)
    plain, _ = _compiled_tree(_plain_tree, parts)
    assert not torch.equal(plain, eager)  # positive control
    tree, targets = _compiled_tree(lambda *p: tp_tree.pairwise_tree(list(p)), parts)
    assert torch.equal(tree, eager)
    assert targets.count("nondet.rounded_add") == 3, targets
