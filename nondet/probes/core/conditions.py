"""The sweep: which batches to build around the target prompts.

A *condition* is one batched generate call: a batch size, the rows the targets occupy,
and what fills the other rows. A *run* is one target row of one condition. The reference
of every prompt is always that prompt alone at batch size 1, listed first.

Two ways to fill a batch (the placement):
- one target prompt per batch, fillers around it (ends | first | last | all): the per-prompt
  filler sweep, P prompts x sizes generate calls. The fillers are cut or repeated to the
  target's token length, so no row is padded.
- every row a target (rows | padded): the other rows of a batch are the other
  prompts, each the target of its own row, so a batch size B takes about ceil(P/B) calls
  and every row is a compared stream.
  `rows` (the default with several prompts) groups prompts of equal token length, so no row
  is padded and a divergence is the batch composition alone, as with fillers; a group
  smaller than B is topped up with same-length fillers. Prompts of unequal length are never
  mixed: left padding changes a row's numerics (its attention spans masked positions, its
  positions are shifted), which its reference, alone and unpadded, never sees.
  `padded` mixes all prompts in left-padded batches (ceil(P/B) calls): faster, closer to a
  server's batches, and a named condition (label "padded") like `--ragged`, because a
  difference there may come from the padding as well as from the batch.
"""

from dataclasses import dataclass

from nondet.errors import UsageError

PLACEMENTS = ("ends", "first", "last", "all", "rows", "padded")
ROW_PLACEMENTS = ("rows", "padded")  # every row a target (several prompts share a batch)
AUTO = "auto"  # rows with several prompts (and no --runs), else ends
MAX_BATCH_SIZE = 65536  # beyond any serving engine's batch: 1,100000000000 reached the allocator (exit 3)
MAX_SIZES = 1024  # a sweep of more generate calls per prompt than this is a typo ("1-100000")


@dataclass(frozen=True)
class Condition:
    condition_id: str  # "<kernels>/bs<B>/<placement>", unique within a run directory
    kernels: str  # "default" | "batch-invariant"
    batch_size: int
    positions: tuple[int, ...]  # rows holding the target, ascending
    fillers: str  # "none" | "same-length" | "ragged" | "copies"
    load: str = "static"
    prompt_id: int = 0  # which target prompt (index into the probe's prompts)
    several_prompts: bool = False  # label the prompt (the run has more than one)
    # rows / padded: the prompt id in each row, -1 = a same-length filler; () = one target prompt
    # (prompt_id) in every target row. prompt_id is then the first row's prompt.
    row_prompts: tuple[int, ...] = ()
    # the prefill axis (core/prefill.py): the form run ("prefix:12", "chunk:8"; "" = one prefill) and
    # the token offsets where the prompt's prefill is cut into forwards on top of the cache
    prefill: str = ""
    splits: tuple[int, ...] = ()
    # --trials: the repeat of a batch (0 = the first); trial t starts the filler rotation t texts later,
    # so the other rows hold other requests (core/batch.py)
    trial: int = 0

    @property
    def is_reference(self) -> bool:
        return self.batch_size == 1 and self.fillers == "none" and not self.splits

    @property
    def label(self) -> str:
        return self._label() + (f" trial {self.trial + 1}" if self.trial else "")

    def _label(self) -> str:
        if self.prefill:
            from nondet.probes.core.prefill import label

            kind, _, size = self.prefill.partition(":")
            return (f"p{self.prompt_id} " if self.several_prompts else "") + label(kind, int(size))
        if self.row_prompts:
            targets = ",".join(f"p{k}" for k in self.row_prompts if k >= 0)
            n_fill = sum(k < 0 for k in self.row_prompts)
            kind = "padded" if self.fillers == "padded" else "rows"
            return f"bs={self.batch_size} {kind} {targets}" + (f" +{n_fill} fillers" if n_fill else "")
        pos = ",".join(map(str, self.positions))
        extra = "" if self.fillers in ("none", "same-length") else f" {self.fillers}"
        prompt = f"p{self.prompt_id} " if self.several_prompts else ""
        return f"{prompt}bs={self.batch_size} pos={pos}{extra}"


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """'1,2,4' or '1-8' or '1-32,64' -> sorted unique sizes; 1 is always included."""
    sizes: set[int] = set()
    parts = [p.strip() for p in text.split(",")]
    if "" in parts:  # '1,,2' or '1,8,': a size left out is a typo, not a request for fewer sizes
        raise UsageError(f"--batch-sizes: an empty entry in {text!r}; give sizes like 1,2,8 or a range like 1-16")
    for part in parts:
        try:
            lo, _, hi = part.partition("-")
            sizes.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise UsageError(f"--batch-sizes: {part!r} is not an integer or a range like 1-8") from None
    if not sizes or min(sizes) < 1:
        raise UsageError("--batch-sizes: every batch size must be an integer >= 1")
    if max(sizes) > MAX_BATCH_SIZE or len(sizes) > MAX_SIZES:  # a typo, not a sweep: refused before any load
        raise UsageError(f"--batch-sizes: at most {MAX_SIZES} sizes of at most {MAX_BATCH_SIZE} rows, not "
                         f"{len(sizes)} up to {max(sizes)}")
    return tuple(sorted(sizes | {1}))


def resolve_placement(placement: str, n_prompts: int, runs: int | None) -> str:
    """`auto`: every row a target (rows) with several prompts, the filler sweep (ends) with one
    or with --runs (which spreads copies of one prompt)."""
    if placement not in PLACEMENTS + (AUTO,):
        raise UsageError(f"--positions must be one of {', '.join((AUTO,) + PLACEMENTS)}, not {placement!r}")
    if placement != AUTO:
        if placement in ROW_PLACEMENTS and runs is not None:
            raise UsageError(f"--runs spreads copies of one prompt over the batches; --positions {placement} "
                             "gives every prompt one row per batch size (drop one of them)")
        return placement
    return "rows" if n_prompts > 1 and runs is None else "ends"


def plan_rows(batch_sizes, lengths: list[int], placement: str, ragged: bool, kernels: str) -> list[Condition]:
    """Every row a target: each prompt's reference (alone), then per batch size the prompts in
    batches of B: grouped by equal token length (rows) or all together, left-padded (padded).
    lengths[k]: prompt k's token count. --ragged adds each prompt's ragged batches."""
    several = len(lengths) > 1
    conditions = [Condition(f"{kernels}/p{k}/bs1/ref" if several else f"{kernels}/bs1/ref", kernels, 1, (0,),
                            "none", prompt_id=k, several_prompts=several) for k in range(len(lengths))]
    groups = [list(range(len(lengths)))] if placement == "padded" else _equal_length_groups(lengths)
    fill = "padded" if placement == "padded" else "prompts"
    for b in (b for b in batch_sizes if b > 1):
        chunks = [g[i:i + b] for g in groups for i in range(0, len(g), b)]
        conditions += [Condition(f"{kernels}/bs{b}/{placement}/{i}", kernels, b, tuple(range(len(c))), fill,
                                 prompt_id=c[0], several_prompts=several,
                                 row_prompts=tuple(c) + (-1,) * (b - len(c))) for i, c in enumerate(chunks)]
    if ragged:
        conditions += [c for k in range(len(lengths))
                       for c in plan_conditions(batch_sizes, "last", None, True, kernels, k, several)
                       if c.fillers == "ragged"]
    return conditions


def _equal_length_groups(lengths: list[int]) -> list[list[int]]:
    """Prompt ids grouped by token length, in order of first appearance: [[0, 2, 3], [1], ...]."""
    groups: dict[int, list[int]] = {}
    for k, n in enumerate(lengths):
        groups.setdefault(n, []).append(k)
    return list(groups.values())


def condition_from_record(record: dict) -> Condition:
    """A conditions.jsonl record as the Condition the probe ran (bisect rebuilds its batch)."""
    return Condition(record["condition_id"], record["kernels"], record["batch_size"], tuple(record["positions"]),
                     record["fillers"], record.get("load", "static"), record.get("prompt_id", 0),
                     row_prompts=tuple(record.get("row_prompts", ())), prefill=record.get("prefill", ""),
                     splits=tuple(record.get("splits", ())), trial=record.get("trial", 0))


def with_trials(conditions: list[Condition], trials: int, fillers: int) -> list[Condition]:
    """--trials N: every batch with a filler row repeated N times in all (ids "<id>/t2" ...), each repeat with
    the fillers rotated; the references (the prompt alone) run once. fillers: how many filler texts there are.
    A batch whose rows are all targets, or one filler text of the target's length, would repeat itself: on
    deterministic kernels the same bits again, counted as new runs in the flip rate's interval; it runs once."""
    from dataclasses import replace

    repeats = [replace(c, condition_id=f"{c.condition_id}/t{t + 1}", trial=t)
               for t in range(1, trials) for c in conditions if _rotates(c, fillers)]
    return conditions + repeats


def _rotates(c: Condition, fillers: int) -> bool:
    """Does a later trial put other requests in this batch (core/batch.py: the rotation)?"""
    if c.is_reference or c.splits:
        return False
    has_filler_row = any(k < 0 for k in c.row_prompts) if c.row_prompts else c.batch_size > len(c.positions)
    return has_filler_row and (fillers > 1 or c.fillers == "ragged")  # ragged: the rotation changes lengths


def plan_prefill(forms, lengths: list[int], kernels: str) -> list[Condition]:
    """The prefill axis of one kernels mode: per prompt and form, the prompt alone (batch size 1) with
    its prefill cut where the form says (core/prefill.py), compared with its reference (one prefill).
    forms: PrefillForms; lengths[k]: prompt k's token count. A size that leaves no token for the
    generate call's own prefill (>= the prompt's length) is not run for that prompt."""
    from nondet.probes.core.prefill import splits

    several = len(lengths) > 1
    out: dict[str, Condition] = {}  # by id: auto's sizes may repeat a size given explicitly
    for k, n in enumerate(lengths):
        prefix = f"{kernels}/p{k}" if several else kernels
        for form in forms:
            for size in form.sizes(n):
                cuts, cid = splits(form.kind, size, n), f"{prefix}/{form.kind}/{size}"
                if cuts and cid not in out:
                    out[cid] = Condition(cid, kernels, 1, (0,), "none", prompt_id=k, several_prompts=several,
                                         prefill=f"{form.kind}:{size}", splits=cuts)
    return list(out.values())


def plan_conditions(batch_sizes, placement: str, runs: int | None, ragged: bool,
                    kernels: str, prompt_id: int = 0, several_prompts: bool = False) -> list[Condition]:
    """One prompt's sweep under one kernels mode: its reference first, then the batches.

    With several prompts each condition id names its prompt ("default/p3/bs8/ends"), so ids
    stay unique in the run directory; a single prompt keeps the short form ("default/bs8/ends").
    """
    if placement not in PLACEMENTS:
        raise UsageError(f"--positions must be one of {', '.join(PLACEMENTS)}, not {placement!r}")
    sizes = [b for b in batch_sizes if b > 1]
    rows = _rows_per_size(sizes, placement, runs)
    prefix = f"{kernels}/p{prompt_id}" if several_prompts else kernels

    def make(name: str, b: int, positions: tuple[int, ...], fill: str) -> Condition:
        return Condition(f"{prefix}/{name}", kernels, b, positions, fill, prompt_id=prompt_id,
                         several_prompts=several_prompts)

    conditions = [make("bs1/ref", 1, (0,), "none")]
    for b in (b for b in sizes if b in rows):
        conditions.append(make(f"bs{b}/{placement}", b, rows[b], "copies" if len(rows[b]) == b else "same-length"))
    if ragged:
        conditions.extend(make(f"bs{b}/ragged", b, (b - 1,), "ragged") for b in sizes)
    return conditions


def _rows_per_size(sizes: list[int], placement: str, runs: int | None) -> dict[int, tuple]:
    if runs is None:
        return {b: _placement_rows(b, placement) for b in sizes}
    capacity = sum(sizes)
    if runs < 1 or runs - 1 > capacity:
        raise UsageError(
            f"--runs must be between 1 and {capacity + 1} for batch sizes "
            f"{','.join(map(str, [1] + sizes))} (one reference plus one run per batch row)")
    counts = {b: 0 for b in sizes}
    remaining = runs - 1  # the reference is one of the N runs
    while remaining:  # round-robin, so every batch size gets runs before any gets many
        for b in sizes:
            if remaining and counts[b] < b:
                counts[b] += 1
                remaining -= 1
    return {b: _spread(b, counts[b]) for b in sizes if counts[b]}


def _placement_rows(b: int, placement: str) -> tuple[int, ...]:
    return {"ends": (0, b - 1), "first": (0,), "last": (b - 1,), "all": tuple(range(b))}[placement]


def _spread(b: int, k: int) -> tuple[int, ...]:
    """k rows spread evenly over a batch of b: 0 and b-1 first, then the middle."""
    if k == 1:
        return (b - 1,)
    return tuple(sorted({round(i * (b - 1) / (k - 1)) for i in range(k)}))
