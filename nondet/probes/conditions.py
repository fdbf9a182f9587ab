"""The sweep: which batches to build around the target prompt.

A *condition* is one batched generate call: a batch size, the rows the target occupies,
and what fills the other rows. A *run* is one target row of one condition. The reference
is always the prompt alone at batch size 1, listed first.
"""

from dataclasses import dataclass

from nondet.errors import UsageError

PLACEMENTS = ("ends", "first", "last", "all")


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

    @property
    def is_reference(self) -> bool:
        return self.batch_size == 1 and self.fillers == "none"

    @property
    def label(self) -> str:
        pos = ",".join(map(str, self.positions))
        extra = "" if self.fillers in ("none", "same-length") else f" {self.fillers}"
        prompt = f"p{self.prompt_id} " if self.several_prompts else ""
        return f"{prompt}bs={self.batch_size} pos={pos}{extra}"


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """'1,2,4' or '1-8' or '1-32,64' -> sorted unique sizes; 1 is always included."""
    sizes: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            lo, _, hi = part.partition("-")
            sizes.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise UsageError(f"--batch-sizes: {part!r} is not an integer or a range like 1-8") from None
    if not sizes or min(sizes) < 1:
        raise UsageError("--batch-sizes: every batch size must be an integer >= 1")
    return tuple(sorted(sizes | {1}))


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
