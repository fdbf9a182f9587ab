"""How one condition of static batches is decoded: eager, on the compiled path, or from CUDA graphs.

The static source and each tensor-parallel rank decode their conditions through a ConditionDecoder,
so `--compile` means the same thing with and without `--tp`: per kernels mode, a warm-up call of
the condition's shape first (compile and CUDA-graph capture, timed apart; compiled.DecodePaths),
then the condition's own call; under the mode, every graph Inductor compiles is sorted by the
graph census (kernels/graph_census.py), and a reduction it did not route refuses the run.
`--cuda-graphs` (core/captured.py) takes the same warm-up per shape, where its graphs are recorded;
nothing is compiled there, so the eager op census stands for the graphs as for eager decoding.
"""

import contextlib
import time
from dataclasses import replace

from nondet.errors import UnsupportedModelError
from nondet.probes.core.kernel_coverage import PARTLY
from nondet.probes.core.replay import DecodeSettings


class ConditionDecoder:
    """Decodes conditions through `run(settings, warm)`; keeps the compiled path's bookkeeping."""

    def __init__(self, settings: DecodeSettings, compile_backend: str | None, device_type: str,
                 census_store=None) -> None:
        self.settings = settings  # the eager settings; the compiled ones add compile_backend
        self.compile_backend = compile_backend
        self.census_store = census_store  # kernels/census_store.py: the mode's graphs cached with their census
        self.paths = None  # compiled.DecodePaths with --compile
        self.warmed: set = set()  # (kernels mode, batch shape) already compiled and captured
        self.graphs = None  # under the mode on the compiled path: what Inductor compiled (GraphCensus)
        self.ahead = None  # compile_ahead.CompileAhead: later modes' steps compiled by second processes
        if compile_backend or settings.cuda_graphs:
            from nondet.probes.core.captured import BACKEND
            from nondet.probes.core.compiled import DecodePaths

            self.paths = DecodePaths(compile_backend or BACKEND, device_type)

    def label(self, kv_cache: str) -> str:
        """The fingerprint's decode_path."""
        if self.paths is None:
            return f"eager, {kv_cache} KV cache"
        from nondet.probes.core.compiled import label

        return label(self.paths.backend, self.paths.device_type)

    def decode(self, mode: str, run, shape: tuple | None = None) -> dict[int, list[dict]]:
        """One condition's streams through `run(settings, warm)`: eager, or compiled (a warm-up call first,
        unless a condition of the same mode and batch shape (core/batch.batch_shape) was warmed up already:
        its graph is compiled and captured, so a second warm-up would only decode)."""
        if self.paths is None:
            return run(self.settings)
        compiled = replace(self.settings, compile_backend=self.compile_backend)
        with self._scope(mode):
            self._warm_once(mode, run, compiled, shape)
            eager = replace(self.settings, kv_cache="static", cuda_graphs=False)
            chosen = compiled if self.paths.compiles(mode) else eager
            started = time.perf_counter()
            rows = run(chosen)
        self.paths.measured(mode, time.perf_counter() - started)
        if self.graphs is not None:
            refuse_uncovered_graphs(self.graphs, self.settings.allow_uncovered)
        return rows

    def _warm_once(self, mode: str, run, compiled: DecodeSettings, shape: tuple | None) -> None:
        """The warm-up call of the condition's shape, unless one of the same mode and shape ran already."""
        if self.paths.compiles(mode) and (shape is None or (mode, shape) not in self.warmed):
            self.paths.warm_up(mode, lambda: self._warm(mode, run, compiled))
            self.warmed.add((mode, shape))

    def _scope(self, mode: str):
        """Around a condition: the compiled path's caches, graph census and saved steps' mode; the CUDA-graph
        path's mode for its counts."""
        from nondet.probes.core.decoding_mode import decoding

        stack = contextlib.ExitStack()
        stack.enter_context(decoding(mode))
        if not self.settings.cuda_graphs:
            from nondet.probes.core.compiled import compile_scope

            stack.enter_context(compile_scope())
            stack.enter_context(self._sorting_graphs(mode))
        return stack

    def _warm(self, mode: str, run, compiled: DecodeSettings):
        """A warm-up call; the mode's first waits for its second process (compile_ahead.py), timed with it."""
        if self.ahead is not None and self.ahead.waits_for(mode):
            self.ahead.wait(mode, self._cache_warm(mode))
        return run(compiled, warm=True)

    def _cache_warm(self, mode: str) -> bool:
        """Whether the modes decoded before `mode` loaded every saved step they used and compiled none."""
        from nondet.probes.core.precompiled import report

        earlier = [what for m, classes in report(self.paths.precompiled_since).items() if m != mode
                   for what in classes.values()]
        return bool(earlier) and all(what.startswith("loaded") for what in earlier)

    def _sorting_graphs(self, mode: str):
        """Under the mode, every graph Inductor compiles goes into self.graphs (graph_census.py)."""
        if mode == "default":
            return contextlib.nullcontext()
        from nondet.kernels.graph_census import GraphCensus, collecting

        self.graphs = self.graphs or GraphCensus(store=self.census_store)
        return collecting(self.graphs)

    def summary(self) -> dict:
        """summary.json's decode_path, compiled_graph_census and (allowed uncovered ops) kernel_coverage (the
        second processes' outcomes the static source adds: it holds them)."""
        doc = {}
        if self.paths is not None:
            doc["decode_path"] = self.paths.as_summary()
        if self.graphs is not None:
            doc["compiled_graph_census"] = self.graphs.to_json()
            if self.graphs.uncovered:  # allowed (refused otherwise): the run is partly invariant
                doc["kernel_coverage"] = {"coverage": PARTLY, "uncovered": self.graphs.uncovered_lines()}
        return doc


def refuse_uncovered_graphs(graphs, allow_uncovered: bool) -> None:
    """A reduction Inductor compiled under the mode that is not ours refuses the run (exit 3, the
    streams already written kept), unless allowed: then summarize labels it partly invariant."""
    if graphs.uncovered and not allow_uncovered:
        from nondet.kernels.coverage import refusal_line

        module, op = sorted(graphs.uncovered)[0]
        raise UnsupportedModelError(refusal_line(module, op, len(graphs.uncovered) - 1, " in the compiled graph"))
