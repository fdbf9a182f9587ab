"""The census of what Inductor compiled under the traced mode (nondet/kernels/graph_census.py).

Each check compiles a small function with Inductor on the CPU under `traced_scope` and reads what
the post-grad pass sorted. Positive control: a float cumsum (no nondet:: op computes it) is uncovered,
named with its op. Negative: a linear layer and an RMSNorm-like mean are the mode's ops (routed), and
nothing is uncovered. The pass sorts nothing outside `collecting`, and the Inductor setting it rides
on is restored when the mode ends.
"""

import pytest
import torch
import torch.nn.functional as F

from nondet.kernels.graph_census import GraphCensus, collecting, inductor_pass
from nondet.kernels.mode import OP_CLASSES
from nondet.kernels.traced import traced_scope

ALL = frozenset(OP_CLASSES)


def _compiled_census(fn, *args) -> GraphCensus:
    torch._dynamo.reset()
    census = GraphCensus()
    with traced_scope(ALL), collecting(census):
        torch.compile(fn, backend="inductor", fullgraph=True)(*args)
    torch._dynamo.reset()
    return census


def _norm_then_linear(x, w):
    rms = x.pow(2).mean(-1, keepdim=True)  # an RMSNorm's mean: the mode's mean_sq
    return F.linear(x * torch.rsqrt(rms + 1e-6), w)


def test_a_cumsum_compiled_under_the_mode_is_uncovered_and_named():
    x, w = torch.randn(3, 16), torch.randn(8, 16)
    census = _compiled_census(lambda x, w: F.linear(x, w).cumsum(-1), x, w)
    assert census.inspected >= 1
    ops = {op for _, op in census.uncovered}
    assert "aten::cumsum" in ops, census.to_json()
    assert census.routed >= 1  # the linear is still ours
    assert any(line.endswith("aten::cumsum (compiled graph)") for line in census.uncovered_lines())


def test_the_modes_own_ops_compile_with_nothing_uncovered():
    x, w = torch.randn(3, 16), torch.randn(8, 16)
    census = _compiled_census(_norm_then_linear, x, w)
    assert census.inspected >= 1 and census.routed >= 2, census.to_json()  # mean_sq and mm
    assert not census.uncovered, census.to_json()


def test_the_same_function_without_the_mode_holds_an_uncovered_sum():
    """Control for the negative case: compiled without the traced mode (the pass installed by hand), the
    same function's mean and matmul are Inductor's own, so the sort must find them."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    census = GraphCensus()
    with inductor_config.patch(post_grad_custom_pre_pass=inductor_pass()), collecting(census):
        torch.compile(_norm_then_linear, backend="inductor", fullgraph=True)(torch.randn(3, 16), torch.randn(8, 16))
    torch._dynamo.reset()
    assert census.routed == 0 and census.uncovered, census.to_json()


def test_nothing_is_sorted_outside_collecting_and_the_setting_is_restored():
    import torch._inductor.config as inductor_config

    before = inductor_config.post_grad_custom_pre_pass
    census = GraphCensus()
    torch._dynamo.reset()
    with traced_scope(ALL):
        assert inductor_config.post_grad_custom_pre_pass is not before
        torch.compile(lambda x: x.cumsum(-1), backend="inductor")(torch.randn(2, 4))
    torch._dynamo.reset()
    assert inductor_config.post_grad_custom_pre_pass is before
    assert census.inspected == 0


@pytest.mark.parametrize("allowed", [False, True])
def test_the_static_source_refuses_an_uncovered_graph_unless_allowed(allowed):
    from nondet.errors import UnsupportedModelError
    from nondet.probes.static.decoder import refuse_uncovered_graphs

    census = GraphCensus()
    census.uncovered[("model.layers.0.mixer", "aten::cumsum")] += 2
    if allowed:
        refuse_uncovered_graphs(census, True)
        return
    with pytest.raises(UnsupportedModelError, match=r"^model.layers.0.mixer: aten::cumsum is not covered by the "
                                                    r"batch-invariant mode in the compiled graph \(--allow-uncovered "
                                                    r"runs it labelled partly invariant\)$"):
        refuse_uncovered_graphs(census, False)
    refuse_uncovered_graphs(GraphCensus(), False)  # nothing uncovered: no refusal


def test_the_terminal_and_report_line_says_what_was_inspected_and_when_nothing_was():
    from nondet.verdict import graph_census_line

    census = GraphCensus(inspected=2, routed=5, row_independent=9)
    census.unreviewed["aten::mystery"] += 1
    assert graph_census_line(census.to_json()) == ("compiled graphs under the mode: 2 inspected, 5 ops "
                                                   "batch-invariant, 9 row-independent, 0 uncovered, 1 unreviewed")
    assert "none inspected" in graph_census_line(GraphCensus().to_json())


def test_inductors_cache_is_off_while_a_census_collects():
    """A graph served from Inductor's cache is never traced: while collecting, the pass's uuid is None
    (Inductor then neither serves nor keeps the graph); otherwise it names this version of the pass."""
    sorting = inductor_pass()
    assert isinstance(sorting.uuid(), str)
    with collecting(GraphCensus()):
        assert sorting.uuid() is None
    assert sorting.uuid() == inductor_pass().uuid()


class _Node:
    """The fields of an FX node the sort reads: an op, its module stack, no arguments."""

    def __init__(self, target, module_class):
        self.target, self.args, self.kwargs = target, (), {}
        self.meta = {"nn_module_stack": {"m": ("model.layers.0.module", module_class)}}


@pytest.mark.parametrize("target, module_class, found", [
    (torch.ops._c10d_functional.all_reduce.default, torch.nn.Embedding, "row_independent"),  # one lookup + zeros
    (torch.ops._c10d_functional.all_gather_into_tensor.default, torch.nn.Linear, "row_independent"),  # a copy
    (torch.ops._c10d_functional.wait_tensor.default, torch.nn.Linear, "row_independent"),
    (torch.ops._c10d_functional.all_reduce.default, torch.nn.Linear, "uncovered"),  # the backend's sum order
])
def test_collectives_in_a_compiled_graph_are_sorted_as_the_eager_census_sorts_them(target, module_class, found):
    from nondet.kernels.graph_census import _sort

    census = GraphCensus()
    _sort(census, _Node(target, module_class))
    assert (census.row_independent == 1) == (found == "row_independent")
    assert bool(census.uncovered) == (found == "uncovered")
    assert not census.unreviewed


def test_the_one_shot_all_reduce_is_ours_only_where_this_process_set_it_up(monkeypatch):
    """kernels/symmetric_sum.py's one-shot in a compiled graph: routed once its set-up check passed here;
    the same op from anyone else's symmetric memory is a sum in an order nobody checked."""
    from nondet.kernels import symmetric_sum
    from nondet.kernels.graph_census import _sort

    one_shot = torch.ops.symm_mem.one_shot_all_reduce_copy.default
    assert one_shot.name().split("::")[1].startswith(symmetric_sum.ONE_SHOT_OP)
    census = GraphCensus()
    _sort(census, _Node(one_shot, torch.nn.Linear))
    assert census.routed == 0 and list(census.uncovered.values()) == [1]  # not set up in this process
    monkeypatch.setattr(symmetric_sum, "route", lambda: symmetric_sum.NAME)
    census = GraphCensus()
    _sort(census, _Node(one_shot, torch.nn.Linear))
    assert census.routed == 1 and not census.uncovered and not census.unreviewed


def _census_of(fn, *args, store=None) -> GraphCensus:
    torch._dynamo.reset()
    census = GraphCensus(store=store)
    with traced_scope(ALL), collecting(census):
        torch.compile(fn, backend="inductor", fullgraph=True)(*args)
    torch._dynamo.reset()
    return census


def test_a_graph_served_from_inductors_cache_keeps_its_census_through_the_store(tmp_path, monkeypatch):
    """With a store, the census leaves Inductor's caches on: the second compile of the same graph is served
    from the cache (the pass does not run: 0 inspected) and its findings, the cumsum included, come from
    the store. The control: the same compile with a census that has no store turns the caches off, so the
    graph is compiled and sorted again."""
    from nondet.kernels.census_store import CensusStore

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    store = CensusStore(tmp_path / "census" / "k.jsonl", "k")
    x, w = torch.randn(3, 16), torch.randn(8, 16)

    def fn(x, w):
        return F.linear(x, w).cumsum(-1)

    first = _census_of(fn, x, w, store=store)
    assert first.inspected >= 1 and first.stored == 0 and len(store.entries()) >= 1
    second = _census_of(fn, x, w, store=CensusStore(store.path, "k"))
    assert second.inspected == 0, "the cache should have served the graph"
    assert second.stored == len(store.entries()) and "aten::cumsum" in {op for _, op in second.uncovered}
    assert second.routed >= 1 and second.to_json()["graphs_from_store"] == second.stored
    without_store = _census_of(fn, x, w)
    assert without_store.inspected >= 1  # caches off: traced and sorted again


def test_a_store_under_another_key_serves_nothing(tmp_path, monkeypatch):
    """The store's key is part of the pass's uuid, so of Inductor's cache key: graphs compiled for another
    key (another model, torch, transformers or nondet kernels) are compiled and sorted again."""
    from nondet.kernels.census_store import CensusStore

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    x, w = torch.randn(3, 16), torch.randn(8, 16)
    _census_of(_norm_then_linear, x, w, store=CensusStore(tmp_path / "a.jsonl", "a"))
    other = _census_of(_norm_then_linear, x, w, store=CensusStore(tmp_path / "b.jsonl", "b"))
    assert other.inspected >= 1 and other.stored == 0 and not other.uncovered


def test_the_store_keeps_one_entry_per_graph_and_skips_a_cut_line(tmp_path):
    from nondet.kernels.census_store import CensusStore

    store = CensusStore(tmp_path / "s.jsonl", "k")
    found = GraphCensus(inspected=1, routed=2).to_json()
    store.append("g1", found)
    store.append("g1", found)  # the same graph again: written once
    other = CensusStore(store.path, "k")  # another rank's process, which has not read the file
    other._seen = set()
    other.append("g1", found)
    with open(store.path, "a") as f:
        f.write('{"format": 1, "graph": "g2", "rou')  # a line cut by a crash
    assert [e["graph"] for e in CensusStore(store.path, "k").entries()] == ["g1"]


def test_a_removed_store_file_makes_cached_graphs_compile_again(tmp_path, monkeypatch):
    """Graphs cached while a store existed are not served once its file is gone (their findings went with
    it): the new file's generation is part of the uuid, so they are compiled and sorted again."""
    from nondet.kernels.census_store import CensusStore

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    x, w = torch.randn(3, 16), torch.randn(8, 16)
    path = tmp_path / "census" / "k.jsonl"
    _census_of(_norm_then_linear, x, w, store=CensusStore(path, "k"))
    assert _census_of(_norm_then_linear, x, w, store=CensusStore(path, "k")).inspected == 0  # served
    path.unlink()
    again = _census_of(_norm_then_linear, x, w, store=CensusStore(path, "k"))
    assert again.inspected >= 1 and again.stored == 0


@pytest.mark.skipif(not hasattr(torch.compiler, "nested_compile_region"), reason="torch without nested compile regions")
def test_a_nested_compile_regions_ops_are_sorted_not_skipped():
    """A layer marked torch.compiler.nested_compile_region compiles as a subgraph the outer graph only calls
    (an invoke_subgraph node, which the sort passes over). The census must see the subgraph's mean and matmul:
    routed where the traced mode reached into the region, else uncovered (torch 2.11 and 2.13 trace the region
    outside the mode's function routing, so they are uncovered there, and the static source refuses the graph).
    A census that read the outer graph alone would count neither (torch 2.13 here: 2 graphs inspected, the
    subgraph's mean and mm uncovered, nothing routed; a torch that inlines the region puts them in the outer one)."""
    region = torch.compiler.nested_compile_region(_norm_then_linear)
    x, w = torch.randn(3, 16), torch.randn(16, 16)  # two calls of one shape: one subgraph, not inlined
    census = _compiled_census(lambda x, w: region(region(x, w), w), x, w)
    uncovered = {op: n for (_, op), n in census.uncovered.items()}
    seen = census.routed + uncovered.get("aten::mean", 0) + uncovered.get("aten::mm", 0)
    assert seen >= 2, census.to_json()
