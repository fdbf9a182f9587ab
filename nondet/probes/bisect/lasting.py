"""Transient or lasting: which of a lockstep's differences is the one that reaches the flip.

A difference lasts only if it enters the state that later steps read. In the lockstep the
sampled token is forced equal, so that state is the KV cache. A step's difference is
TRANSIENT when every cache input of that step is bit-identical: it was absorbed (rounded
away, e.g. by the residual add) before it reached the keys and values, and the next step
starts from identical state. It is LASTING from the first step where a cache input differs:
a cached entry is never rewritten, every later step reads it (even at steps where its effect
rounds away: `silent_steps` counts those). A token flip with no cached difference before it
was born at the flip step itself (it reached the logits).

Cache inputs of one step: the points of an attention module executed before its core
(k/v projections and norms, fused qkv; query-only points excluded) and the rotary
embedding. A model whose attention is not recognised (no `.core` point) has none known:
there every differing step counts as lasting (the first difference, conservatively).

Where inside the step the lasting difference is born: trace back from the first differing
cache input (or from the logits, at a flip) along the residual stream. The origin is the
first differing point after the last decoder layer whose output is still bit-identical;
differing points before that layer's output were absorbed within the step.
"""

from dataclasses import dataclass, field

from nondet.probes.bisect.capture import CORE_SUFFIX

POINT_KEYS = ("step", "module", "op_class", "layer", "order", "max_abs_diff", "max_ulp", "first_diff_index")
_QUERY = ("q_", "query", "wq")  # leaf names that feed the query only, never the cache


@dataclass
class StepVerdict:
    step: int
    first: dict | None  # the first differing record of the step, None when every point is identical
    carries: bool  # a cache input differs: the difference enters the KV cache and lasts
    reach: str | None  # how far the step's difference got: kv cache / logits / residual stream / layer
    origin: dict | None  # where the difference that reaches `reach` is born (traced), None if identical
    enters: dict | None = None  # the first differing cache input (or the logits), where it is traced from


def judge(step: int, records: list[dict]) -> StepVerdict:
    """records: one step's comparisons in execution order (keys of lockstep rows + "block")."""
    differing = [i for i, r in enumerate(records) if r["differs"]]
    if not differing:
        return StepVerdict(step, None, False, None, None)
    inputs = cache_inputs(records)
    hit = differing[0] if inputs is None else next((i for i in inputs if records[i]["differs"]), None)
    if hit is not None:
        return StepVerdict(step, records[differing[0]], True, "kv cache", trace(records, hit), records[hit])
    if records[-1]["differs"]:
        return StepVerdict(step, records[differing[0]], False, "logits", trace(records, len(records) - 1),
                           records[-1])
    residual = any(r["block"] and r["differs"] for r in records)
    return StepVerdict(step, records[differing[0]], False, "residual stream" if residual else "layer",
                       records[differing[0]])


def cache_inputs(records: list[dict]) -> list[int] | None:
    """Indexes of the step's cache-input points; None when no attention core was captured."""
    cores = [i for i, r in enumerate(records) if r["module"].endswith(CORE_SUFFIX)]
    if not cores:
        return None
    found = {i for i, r in enumerate(records) if r["op_class"] == "rotary"}
    for c in cores:
        prefix = records[c]["module"][: -len(CORE_SUFFIX)] + "."
        found |= {i for i in range(c) if records[i]["module"].startswith(prefix)
                  and not records[i]["module"][len(prefix):].startswith(_QUERY)}
    return sorted(found)


def trace(records: list[dict], target: int) -> dict:
    """The first differing point after the last bit-identical residual stream before `target`."""
    start = max((i + 1 for i in range(target) if records[i]["block"] and not records[i]["differs"]), default=0)
    return next(r for r in records[start: target + 1] if r["differs"])


@dataclass
class Tracker:
    """Feeds on one StepVerdict per step, in order: transients until the lasting divergence."""

    lasting: dict | None = None  # origin of the lasting divergence (+ via, enters_at), None so far
    transients: list[dict] = field(default_factory=list)  # one per differing step before it
    silent_steps: int = 0  # steps after the lasting origin where no captured point differs

    def add(self, v: StepVerdict, flip: bool) -> None:
        if self.lasting is not None:
            self.silent_steps += v.first is None
        elif v.carries or (flip and v.reach == "logits"):
            self.lasting = {**_point(v.origin), "via": v.reach, "enters_at": v.enters["module"]}
        elif v.first is not None:
            self.transients.append({**_point(v.first), "reach": v.reach})

    def result(self) -> dict | None:
        return None if self.lasting is None else {**self.lasting, "silent_steps": self.silent_steps}


def _point(record: dict) -> dict:
    return {k: record[k] for k in POINT_KEYS}
