"""Teacher-forced lockstep replay: the reference and one divergent condition, step-aligned.

Both runs go through the probe's own generate call (replay.generate: same GenerationConfig,
same recorder, same prefill + one-token decode steps, same KV cache), with the hooks, the
forced tokens and the stop passed in, so their numerics are the probe's by construction
and the flip lands where the probe saw it. The reference (the prompt alone, batch size 1)
runs first and keeps its target row at every point and step. The divergent condition runs
second: its target row is FORCED to the reference's token at every step (fillers pick
their own), so both stay aligned past the flip; each step's points are compared with the
reference's when the step ends, and only the comparison (max diffs) is kept.

The divergent target's "own" token at each step is what it would have picked given the
same history: the first step where it differs from the reference's token is the flip,
exactly the probe's first token divergence.

Each step's comparisons are judged as they end (lasting.py): a difference absorbed before
it reaches the KV cache is transient; the first one that enters the cache (or, failing
that, the one at the flip) is the lasting divergence, and its step's table is kept.
"""

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from nondet.errors import OutOfMemoryError
from nondet.probes.bisect.capture import Point, Tap
from nondet.probes.bisect.compare import compare, quick_compare
from nondet.probes.bisect.lasting import Tracker, judge
from nondet.probes.bisect.routing import RoutingWatch
from nondet.probes.core.batch import Batch
from nondet.probes.core.recorder import StepRecorder
from nondet.probes.core.replay import DecodeSettings, eos_ids, generate, new_recorder, truncate_at_eos

KernelScope = Callable[[], contextlib.AbstractContextManager]  # a fresh kernels mode per run


@dataclass
class Lockstep:
    reference: list[dict]  # reference step records (recorder format: token, logprob, top, margin)
    divergent: list[dict]  # the divergent target's own choice per step, teacher-forced history
    rows: dict[int, list[dict]] = field(default_factory=dict)  # kept steps -> comparisons, execution order
    amplification: list[dict] = field(default_factory=list)  # residual stream: step, layer, max_abs_diff
    first_diff: dict | None = None  # the first comparison row whose bits differ (the origin)
    lasting: dict | None = None  # where the divergence that enters the KV cache / flips is born
    transients: list[dict] = field(default_factory=list)  # differing steps before it, each absorbed
    routing: dict | None = None  # the first (step, layer, position) whose MoE expert set differs (routing.py)
    routing_changes: int = 0  # router calls (step, layer, position) whose expert set differs

    @property
    def flip_step(self) -> int | None:
        for step, (ref, own) in enumerate(zip(self.reference, self.divergent)):
            if ref["token"] != own["token"]:
                return step
        return None

    @property
    def first_numeric_step(self) -> int | None:
        return None if self.first_diff is None else self.first_diff["step"]

    @property
    def first_logprob_step(self) -> int | None:
        """The probe's measure on the replay: first step whose token or its logprob bits differ."""
        for step, (ref, own) in enumerate(zip(self.reference, self.divergent)):
            if (ref["token"], ref["logprob"]) != (own["token"], own["logprob"]):
                return step
        return None

    @property
    def steps(self) -> int:
        return len(self.divergent)


def run_lockstep(model, tokenizer, reference: Batch, divergent: Batch, settings: DecodeSettings,
                 kernels: KernelScope = contextlib.nullcontext, stop_at_flip: bool = False,
                 row: int | None = None, tap: Callable[..., Tap] = Tap) -> Lockstep:
    """Replay reference then divergent (target row `row`, default divergent.target_rows[0]) and compare.

    tap(model, row, batch_size, sink): the capture (capture.Tap, or a subclass adding points:
    probes/tp/collective.TPTap adds each row-parallel linear's all-reduce)."""
    eos = eos_ids(model, tokenizer)
    ref_sink = RecordSink()
    ref_recorder = new_recorder(reference, settings)
    with kernels():
        _replay(model, tokenizer, reference, settings, tap(model, reference.target_rows[0], 1, ref_sink),
                ref_recorder)
    ref_steps = truncate_at_eos(ref_recorder.steps[reference.target_rows[0]], eos)
    tokens = [s["token"] for s in ref_steps]
    row = divergent.target_rows[0] if row is None else row
    recorder = new_recorder(divergent, settings)
    force = _Force(recorder, row, tokens)
    sink = CompareSink(ref_sink, lambda step: step in force.flips)
    feed = JoinedPrefill(sink, len(divergent.splits)) if divergent.splits else sink
    with kernels():
        _replay(model, tokenizer, divergent, settings, tap(model, row, len(divergent.input_ids), feed),
                recorder, [force], [_Stop(force, stop_at_flip)])
    feed.flush()
    return Lockstep(ref_steps, recorder.steps[row][: len(tokens)], sink.rows, sink.amplification, sink.first,
                    sink.tracker.result(), sink.tracker.transients, sink.routing.first, sink.routing.changes)


def _replay(model, tokenizer, batch: Batch, settings: DecodeSettings, tap: Tap, recorder: StepRecorder,
            after: Sequence = (), stopping: Sequence = ()) -> None:
    """The probe's own generate call (replay.generate) of the batch under `tap`."""
    try:
        with tap:
            generate(model, tokenizer, batch, settings, recorder, after, stopping)
    except OutOfMemoryError as exc:
        raise OutOfMemoryError(f"out of memory replaying batch size {len(batch.input_ids)} for bisect") from exc


class _Force:
    """Logits processor after the recorder: notes whether the target's own token differs from
    the reference's (a flip), then forces the reference's token so the histories stay equal."""

    def __init__(self, recorder: StepRecorder, row: int, tokens: list[int]):
        self.recorder, self.row, self.tokens = recorder, row, tokens
        self.step = 0
        self.flips: set[int] = set()

    def __call__(self, input_ids, scores):
        if self.step < len(self.tokens):
            if self.recorder.steps[self.row][-1]["token"] != self.tokens[self.step]:
                self.flips.add(self.step)
            scores[self.row] = float("-inf")
            scores[self.row, self.tokens[self.step]] = 0.0
        self.step += 1
        return scores


class _Stop:
    """Stopping criterion: the reference's steps are covered, or (when asked) the token flipped."""

    def __init__(self, force: _Force, at_flip: bool):
        self.force, self.at_flip = force, at_flip

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        done = self.force.step >= len(self.force.tokens) or (self.at_flip and bool(self.force.flips))
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class RecordSink:
    """Sink for the reference: keeps the target row of every point, keyed per step.
    Public: the speculative lockstep (speculative/bisect.py) records its reference with it too."""

    def __init__(self):
        self.points: dict[int, list[tuple[tuple, Point]]] = {}  # step -> [(key, point)] in order
        self.tensors: dict[tuple, object] = {}  # (step, key) -> tensor [seq, ...]
        self._calls: Counter = Counter()

    def __call__(self, step: int, point: Point, row) -> None:
        key = _key(self._calls, step, point)
        self.points.setdefault(step, []).append((key, point))
        self.tensors[(step, key)] = row.clone()


class CompareSink:
    """Sink for the divergent run: compares each point with the reference's, one step at a time.
    Public: the speculative lockstep (speculative/bisect.py) feeds its verification chunks to it too.

    A step's points are buffered and compared when the step is over, because only then is
    it known whether the step is the flip. Full statistics (rel diff, ULP, first index) are
    computed until the lasting divergence is found and at the flip; the steps kept in the
    table are the first numeric divergence, the lasting divergence's step and the flip. Other
    steps keep the residual stream's max abs diff (amplification) and the bitwise verdict.
    """

    def __init__(self, reference: RecordSink, is_flip: Callable[[int], bool]):
        self.reference, self.is_flip = reference, is_flip
        self.order = {s: {k: i for i, (k, _) in enumerate(pts)} for s, pts in reference.points.items()}
        self.rows: dict[int, list[dict]] = {}  # kept steps -> rows in execution order
        self.amplification: list[dict] = []  # {"step", "layer", "max_abs_diff"} of the residual stream
        self.first: dict | None = None
        self.tracker = Tracker()
        self.routing = RoutingWatch()
        self._calls: Counter = Counter()
        self._pending: list[tuple[int, tuple, Point, object]] = []

    def __call__(self, step: int, point: Point, row) -> None:
        if self._pending and self._pending[0][0] != step:
            self.flush()
        self._pending.append((step, _key(self._calls, step, point), point, row.clone()))

    def flush(self) -> None:
        if not self._pending:
            return
        step = self._pending[0][0]
        flip = self.is_flip(step)
        searching = self.tracker.lasting is None
        records = [self._compare_one(step, key, point, got, searching or flip)
                   for _, key, point, got in self._pending]
        records = [r for r in records if r is not None]
        self._pending.clear()
        self.tracker.add(judge(step, records), flip)
        found = searching and self.tracker.lasting is not None
        if flip or found or (self.first is not None and self.first["step"] == step):
            self.rows[step] = records

    def _compare_one(self, step: int, key: tuple, point: Point, got, detail: bool) -> dict | None:
        ref = self.reference.tensors.pop((step, key), None)
        got = _align(got, ref)
        if got is None:
            return None
        diff = compare(ref, got) if detail else quick_compare(ref, got)
        if point.top_k and diff.differs:
            self.routing.check(step, point, ref, got)
        record = {"step": step, "order": self.order[step][key], "layer": point.layer, "module": point.module,
                  "op_class": point.op_class, **diff.to_row(), "block": point.block}
        if point.block:
            self.amplification.append({"step": step, "layer": point.layer, "max_abs_diff": diff.max_abs_diff})
        if diff.differs and self.first is None:
            self.first = record
        return record


class JoinedPrefill:
    """Sink in front of CompareSink for a run whose prefill is several forwards (the prefill axis,
    core/prefill.py): the Tap counts each forward as a step, so the `pieces` forwards before
    generate's own prefill come as steps 0..pieces-1. Their points are joined along the sequence
    into one step 0, the shape of the reference's single prefill (every position compared, those of
    the cached prefix included); later steps pass on, renumbered."""

    def __init__(self, sink: CompareSink, pieces: int):
        self.sink, self.pieces = sink, pieces
        self.calls: list[list[tuple[Point, object]]] = []  # per prefill forward: (point, row [seq, ...])

    def __call__(self, step: int, point: Point, row) -> None:
        if step > self.pieces:
            self._emit_prefill()
            self.sink(step - self.pieces, point, row)
            return
        while len(self.calls) <= step:
            self.calls.append([])
        self.calls[step].append((point, row.clone()))

    def flush(self) -> None:
        self._emit_prefill()
        self.sink.flush()

    def _emit_prefill(self) -> None:
        import torch

        calls, self.calls = self.calls, []
        for i, (point, first) in enumerate(calls[0] if calls else ()):
            parts = [c[i][1] for c in calls if i < len(c) and c[i][0] == point]
            if len(parts) == len(calls) and all(p.dim() >= 1 and p.shape[1:] == first.shape[1:] for p in parts):
                self.sink(0, point, torch.cat(parts))


def _key(calls: Counter, step: int, point: Point) -> tuple:
    """(module, n): the n-th call of that module in this step (a module may run twice)."""
    n = calls[(step, point.module)]
    calls[(step, point.module)] += 1
    return (point.module, n)


def _align(got, ref):
    """The divergent row trimmed to the reference's shape: left padding -> keep the last positions."""
    if ref is None or got.dtype != ref.dtype:
        return None
    if got.shape == ref.shape:
        return got
    if got.dim() >= 1 and got.shape[1:] == ref.shape[1:] and got.shape[0] > ref.shape[0]:
        return got[got.shape[0] - ref.shape[0]:]
    return None

