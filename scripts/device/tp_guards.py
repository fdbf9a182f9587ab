"""dynamo's guards of gpu_tp_speed.py's compiled TP step: counted, dumped, dropped and timed, and the ranks' main
threads pinned, to find where a step's host time goes (docs/benchmarks.md, 2026-11-30).

    --count-guards                the guards dynamo built and kept per row, and their check's latency (guard_us)
    NONDET_TP_GUARD_DUMP=DIR      the kept guards by type and source, per rank
    NONDET_TP_DROP_GUARDS=REGEX   a group of guards dropped (a measurement only: the step is unguarded there)
    NONDET_TP_PIN_ROWS=1          the check again after the timed calls, then the step and the check with each
                                  rank's main thread on a core of its own
"""

import json
import os
import re
import statistics
from pathlib import Path

# NONDET_TP_PIN_ROWS=1: each compiled row also timed with each rank's main thread pinned to a core of its own (a
# physical core apart from the other ranks'), and dynamo's guard check timed again after the timed calls
PIN_ROWS = os.environ.get("NONDET_TP_PIN_ROWS") == "1"
GUARD_DUMP = os.environ.get("NONDET_TP_GUARD_DUMP", "")  # see dump_guards
# NONDET_TP_DROP_GUARDS=REGEX (with --count-guards): guards whose "TYPE source" matches are dropped, to time the
# check without them (guard_us_steady under NONDET_TP_PIN_ROWS); a measurement only: the step is unguarded there
DROP_GUARDS = re.compile(os.environ["NONDET_TP_DROP_GUARDS"]) if os.environ.get("NONDET_TP_DROP_GUARDS") else None
# --count-guards: each compiled row records how many guards dynamo built for its graph and how many the
# filter kept (a host cost per step that is the same on every machine); TP1 then gets a filter that
# keeps every guard (the same compile config otherwise: CUDA graphs asked for as an option)
COUNTERS: dict = {}  # id(model) -> (filter, tally)
GUARD_US: list[float] = []  # --count-guards: dynamo's own latency of each new graph's guards, us (record_guard_latency)


def counting_filter(model, inner):
    """One filter per model (transformers keeps one compiled call per compile config): `inner`'s verdicts
    (all kept when None), tallying the guards of the graph compiled last."""
    if id(model) not in COUNTERS:
        tally = {"guards": 0, "guards_kept": 0}

        def keep(entries):
            flags = inner(entries) if inner is not None else [True] * len(entries)
            if DROP_GUARDS is not None:
                flags = [f and not DROP_GUARDS.search(f"{e.guard_type} {e.name}") for e, f in zip(entries, flags)]
            tally.update(guards=len(entries), guards_kept=sum(flags))
            if GUARD_DUMP:
                dump_guards(entries, flags)
            return flags

        COUNTERS[id(model)] = (keep, tally)
    return COUNTERS[id(model)][0]


def dump_guards(entries, flags) -> None:
    """NONDET_TP_GUARD_DUMP=DIR: the kept guards of the graph compiled last, counted by (type, source with
    layer numbers as N), into DIR/guards-<world>-<rank>-<n>.json: what TP adds to a step's guard set."""
    import collections

    counts = collections.Counter()
    for entry, kept in zip(entries, flags):
        if kept:
            counts[f"{entry.guard_type} {re.sub(r'[0-9]+', 'N', entry.name)[:300]}"] += 1
    rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    n = len(list(Path(GUARD_DUMP).glob(f"guards-{world}-{rank}-*.json")))
    Path(GUARD_DUMP, f"guards-{world}-{rank}-{n}.json").write_text(json.dumps(counts.most_common(), indent=0))


def own_core() -> int:
    """A CPU for this rank's main thread: the first thread of physical core 2 + rank among those this process
    may run on (core 0 and 1 left to the system), so no two ranks share a core or its hyperthread sibling."""
    rank = int(os.environ.get("RANK", "0"))
    cores = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = (topology / "physical_package_id").read_text(), (topology / "core_id").read_text()
        except OSError:  # no topology shown (a container may hide it): each CPU its own core
            key = cpu
        cores.setdefault(key, cpu)
    firsts = list(cores.values())
    return firsts[(2 + rank) % len(firsts)]


def pinned_figures(timed_calls) -> dict:
    """NONDET_TP_PIN_ROWS: the guard check now (after compiling, every rank in its timed calls), then the step
    and the check with this rank's main thread on a core of its own; the thread's CPUs put back after."""
    allowed = os.sched_getaffinity(0)
    figures = {"guard_us_steady": guard_check_us()}
    core = own_core()
    os.sched_setaffinity(0, {core})  # 0: the calling thread
    try:
        per_call, _ = timed_calls()
        figures.update(cpu=core, ms_pinned=round(statistics.median(per_call), 3), guard_us_pinned=guard_check_us())
    finally:
        os.sched_setaffinity(0, allowed)
    return figures


LAST_GUARDS: list = []  # [(root, scope)]: the last guard set record_guard_latency saw, for guard_check_us


def guard_check_us() -> float | None:
    """dynamo's check of the last compiled graph's guards, timed now over 300 checks (us)."""
    if not LAST_GUARDS:
        return None
    import torch._dynamo.guards as guards

    return round(guards.profile_guard_manager.__wrapped__(*LAST_GUARDS[0], 300), 1)


def record_guard_latency() -> None:
    """Keep dynamo's measure of a new graph's guard check (what its cache lookup costs every call), taken
    over 300 checks instead of its default 1: where a step's host time goes, per row, on any host."""
    import torch._dynamo.guards as guards

    original = getattr(guards, "profile_guard_manager", None)
    if original is None:  # another torch: the rows go without it
        return

    def timed(root, scope, _iterations):
        latency = original(root, scope, 300)
        GUARD_US.append(latency)
        LAST_GUARDS[:] = [(root, scope)]  # the last only: an earlier row's scope is not kept alive
        return latency

    timed.__wrapped__ = original
    guards.profile_guard_manager = timed
