"""Lockstep replay of a speculative condition: one-token decoding vs k+1 verification chunks.

Speculative decoding changes no token in exact arithmetic; what it changes is how many query
rows the target computes at once. Plain greedy decoding computes each position alone (q_len
1 after the prefill); a verification round computes the last accepted token and the k drafted
ones together (q_len k+1; round 0 is the prompt and its drafts in one forward). So the same
logical position gets its activations from a 1-row call in the reference and from a k+1-row
call in the speculative run, and any kernel whose result depends on the row count (a split
reduction, a tile choice) changes its bits.

Both runs are replayed here by calling the target directly (one KV cache each, the same call
arguments), teacher-forced: the reference decodes greedily one token per forward; the
speculative run is fed the reference's tokens as its drafts, in the rounds its stream
recorded (each step's `round`, each round's `drafted`), keeps the `produced` positions of a
round and crops the cache to them, as assisted decoding does. The hooks of capture.py record
every point of every forward; a chunk's rows are cut back into logical steps (step 0: the
prompt's positions, step s >= 1: position P + s - 1, whose logits choose token s), so step s
of both runs is compared point by point by bisect/lockstep.py's sinks (RecordSink, CompareSink): the
same origin, lasting divergence and module table as a static bisect.
"""

from collections import Counter

from nondet.kernels.hf_names import cache_kwarg
from nondet.probes.bisect.capture import Point, Tap
from nondet.probes.bisect.lockstep import CompareSink, KernelScope, Lockstep, RecordSink
from nondet.probes.core.recorder import step_record

Round = tuple[int, int]  # (tokens drafted, tokens produced) of one verification round


def stream_rounds(stream: dict) -> list[Round]:
    """A speculative stream's rounds: (drafted, produced), produced counted from its steps' `round`."""
    produced = Counter(s["round"] for s in stream["steps"] if s.get("round") is not None)
    drafted = stream.get("drafted") or []
    return [(drafted[r] if r < len(drafted) else 0, produced[r]) for r in sorted(produced)]


def run_speculative_lockstep(model, prompt: list[int], rounds: list[Round], steps: int, kernels: KernelScope,
                             stop_at_flip: bool = False) -> Lockstep:
    """Reference (q_len 1 per step) then the speculative rounds, teacher-forced, over `steps` steps."""
    record = RecordSink()
    with kernels():
        reference = _Reference(model, prompt, record).run(steps)
    tokens = [s["token"] for s in reference]
    flips: set[int] = set()
    sink = CompareSink(record, lambda step: step in flips)
    with kernels():
        own = _Verify(model, prompt, tokens, sink, flips).run(verify_schedule(rounds, len(tokens)), stop_at_flip)
    sink.flush()
    return Lockstep(reference, own, sink.rows, sink.amplification, sink.first, sink.tracker.result(),
                    sink.tracker.transients)


def verify_schedule(rounds: list[Round], steps: int) -> list[Round]:
    """The recorded rounds, cut at `steps`; past the stream's end, its last round's draft length."""
    out, covered = [], 0
    for drafted, produced in rounds:
        if covered >= steps:
            return out
        out.append((drafted, max(1, produced)))
        covered += max(1, produced)
    drafted = rounds[-1][0] if rounds else 0
    while covered < steps:
        out.append((drafted, drafted + 1))
        covered += drafted + 1
    return out


class _Forward:
    """Calls the target on positions [cache length, end) of `ids` with one DynamicCache, as
    generate does (attention mask, positions, cache positions, logits of the last rows only)."""

    def __init__(self, model):
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache(config=model.config)

    def __call__(self, ids: list[int], end: int, logits_rows: int):
        import torch

        start = self.cache.get_seq_length()
        device = self.model.device
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids[start:end]], device=device),
                             attention_mask=torch.ones((1, end), dtype=torch.long, device=device),
                             position_ids=torch.arange(start, end, device=device)[None],
                             cache_position=torch.arange(start, end, device=device),
                             use_cache=True, logits_to_keep=logits_rows, **{cache_kwarg(self.model): self.cache})
        return out.logits[0].float()  # [logits_rows, vocab]

    def crop(self, length: int) -> None:
        """Keep the first `length` positions. transformers' crop takes the count to REMOVE, as a
        negative number: from 5.18 a positive one raises "Calling crop with a positive value"
        (before, it meant an absolute length), and crop(0) is not a no-op for every layer type,
        so crop is called only when something is removed."""
        held = self.cache.get_seq_length()
        assert 0 <= length <= held, f"crop to {length} positions of a cache holding {held}"
        if length < held:
            self.cache.crop(-(held - length))


class _Collect:
    """Tap sink: the points of one forward, in execution order, as (point, tensor [rows, ...])."""

    def __init__(self):
        self.points: list[tuple[Point, object]] = []

    def __call__(self, step: int, point: Point, row) -> None:
        self.points.append((point, row.clone()))

    def take(self) -> list[tuple[Point, object]]:
        points, self.points = self.points, []
        return points


class _Reference:
    """Plain greedy decoding: the prefill (step 0), then one forward of one row per step."""

    def __init__(self, model, prompt: list[int], record: RecordSink):
        self.model, self.ids, self.record = model, list(prompt), record

    def run(self, steps: int) -> list[dict]:
        forward, collect, out = _Forward(self.model), _Collect(), []
        with Tap(self.model, 0, 1, collect):
            for step in range(steps):
                logits = forward(self.ids, len(self.ids), 1)
                for point, tensor in collect.take():
                    self.record(step, point, tensor)
                token = int(logits[0].argmax())
                out.append(step_record(logits[:1], token, step=step, row=0))
                self.ids.append(token)
        return out


class _Verify:
    """The speculative rounds, fed the reference's tokens: round r's forward covers the last
    accepted token and `drafted` tokens after it; its first `produced` steps are kept."""

    def __init__(self, model, prompt: list[int], tokens: list[int], sink: CompareSink, flips: set[int]):
        self.model, self.prompt, self.tokens, self.sink, self.flips = model, len(prompt), tokens, sink, flips
        self.ids = list(prompt) + tokens

    def run(self, rounds: list[Round], stop_at_flip: bool) -> list[dict]:
        forward, collect, own = _Forward(self.model), _Collect(), []
        with Tap(self.model, 0, 1, collect):
            for drafted, produced in rounds:
                first = len(own)
                start = 0 if first == 0 else self.prompt + first - 1  # the cache's length
                end = self.prompt + first + drafted  # last input: the round's last drafted token
                self._pad(end)
                logits = forward(self.ids, end, drafted + 1)  # rows: steps first .. first + drafted
                kept = min(produced, drafted + 1, len(self.tokens) - first)
                own += self._choose(logits, first, kept)
                self._feed(collect.take(), start, end, first, kept)
                forward.crop(self.prompt + first + kept - 1)  # rejected drafts leave the cache
                if len(own) >= len(self.tokens) or (stop_at_flip and self.flips):
                    break
        return own

    def _pad(self, end: int) -> None:
        """Drafts past the reference's last token (not compared): repeat it, to keep the chunk's shape."""
        self.ids += [self.ids[-1]] * max(0, end - len(self.ids))

    def _choose(self, logits, first: int, kept: int) -> list[dict]:
        out = []
        for i in range(kept):
            token = int(logits[i].argmax())
            if token != self.tokens[first + i]:
                self.flips.add(first + i)
            out.append(step_record(logits[i:i + 1], token, step=first + i, row=0))
        return out

    def _feed(self, points: list[tuple[Point, object]], start: int, end: int, first: int, kept: int) -> None:
        """Each kept step's rows of every point, step by step, in execution order, to the sink."""
        for step in range(first, first + kept):
            lo, hi = (0, self.prompt) if step == 0 else (self.prompt + step - 1, self.prompt + step)
            for point, tensor in points:
                rows = step_rows(tensor, start, end, lo, hi)
                if rows is not None:
                    self.sink(step, point, rows)


def step_rows(tensor, start: int, end: int, lo: int, hi: int):
    """Rows of positions [lo, hi) of a point's tensor [rows, ...] from a forward over positions
    [start, end): its rows are the last positions before `end` (all of them, or the kept logits).
    None when it holds none of them, or has more rows than the forward has positions."""
    if tensor.dim() < 1 or tensor.shape[0] > end - start:
        return None
    first = end - tensor.shape[0]
    if hi <= first:
        return None
    return tensor[max(lo, first) - first: hi - first]


def speculative_replayer(loaded, prompt: str, stream: dict, steps: int, scope):
    """(op classes made invariant or None, steps, stop at flip) -> Lockstep, as static/bisect.py's replays.

    scope: op classes -> a fresh kernels mode per run (the condition's mode plus those classes)."""
    from nondet.probes.core.batch import tokenize_inputs

    ids = tokenize_inputs(loaded.tokenizer, prompt, ())[0]
    rounds = stream_rounds(stream)

    def replay(ops: tuple[str, ...] | None, horizon: int | None = None, stop_at_flip: bool = False) -> Lockstep:
        return run_speculative_lockstep(loaded.model, ids, rounds, horizon or steps, scope(ops), stop_at_flip)

    return replay


def speculative_part(stream: dict, ls: Lockstep) -> dict:
    """bisect.json "speculative": the form, its rounds replayed, the verification chunk sizes."""
    rounds = verify_schedule(stream_rounds(stream), ls.steps)
    return {"form": stream.get("speculative"), "rounds": len(rounds),
            "chunk_rows": sorted({d + 1 for d, _ in rounds}), "acceptance_rate": stream.get("acceptance_rate")}
