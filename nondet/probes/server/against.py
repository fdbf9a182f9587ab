"""Two deployments of one model, one probe: `nondet probe --endpoint URL_A --against URL_B`.

Each side is a server probe of its own (server/source.py) with the same prompt, the same
copies, the same seeded filler schedule: A first, then B, so neither side's traffic loads the
other. Their records share one run directory as conditions labelled by side and endpoint:

    default/server-a/ref    A: the request sent alone       <- THE reference of the run
    default/server-a/burst  A: the copies under filler load
    default/server-b/ref    B: the request sent alone
    default/server-b/burst  B: the copies under filler load

The reference is A's answer sent alone: the quietest answer of the deployment named first, so
diff, report and gate read every answer of both sides as "differs from A alone or not", as for
one server (summary.json "load" is a server's, naming B in "against"). summary.json "against"
(probes/server/against_summary.py) adds per side its distinct completions and first divergence from
ITS OWN answer alone, and across the sides the distinct
completions, the first token where B alone leaves A alone, and, where both return logprobs,
the first step whose logprob bits differ. Answers are compared at the lowest level any of
them allows (a server without logprobs: texts, tokenized with --tokenizer when given).

Two engines (say transformers serve and llama.cpp's server, server/engines.py) are a
cross-engine comparison: other kernels, often other weight formats, so A and B are expected to
differ from the first steps; the summary and the report say so instead of calling it batch
variance. Each side's own distinct completions under load are still that engine's batch variance.
"""

from dataclasses import replace

from nondet.probes.core.source import Emit, Opened, Planned
from nondet.probes.server.against_summary import against_section, against_verdict
from nondet.probes.server.source import DEFAULT_RUNS, ServerSource, Side, diff_answers, level_notes, load_settings
from nondet.probes.server.tally import Counts
from nondet.rundir.records import ConditionRecord, Summary

PREFIXES = {"A": "default/server-a", "B": "default/server-b"}


class AgainstSource:
    kind = "server"

    def __init__(self, config, on_progress=None) -> None:
        self.config = config
        self.endpoints = {"A": config.load.endpoint, "B": config.load.against}
        self.counts: dict[str, Counts] = {}
        self.sides = {name: ServerSource(replace(config, load=replace(config.load, endpoint=url, against=None)),
                                         self._progress(name, on_progress), _side(name, config))
                      for name, url in self.endpoints.items()}

    def open(self) -> Opened:
        opened = {name: side.open() for name, side in self.sides.items()}
        return Opened(_fingerprint({name: o.fingerprint for name, o in opened.items()}, self.endpoints))

    def attach(self, writer) -> None:
        for side in self.sides.values():
            side.attach(writer)

    def plan(self) -> list[Planned]:
        return [planned for side in self.sides.values() for planned in side.plan()]

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        return self.sides[_side_of(planned.condition_id)].replay(planned, emit)

    def summarize(self, streams: list[dict]) -> Summary:
        doc = diff_answers(streams, self.sides["A"].tokenizer)
        level = doc.pop("compare_level")
        engines = {name: side.engine for name, side in self.sides.items()}  # engines.py
        section = against_section(streams, self.endpoints, level, engines)
        load = {"mode": "server", "compare_level": level, "endpoint": self.endpoints["A"],
                "against": self.endpoints["B"], **load_settings(self.config), "notes": _notes(level)}
        return Summary(doc["modes"], against_verdict(section), extra={"load": load, "against": section})

    def close(self) -> None:
        for side in self.sides.values():
            side.close()

    def _progress(self, name: str, on_progress):
        """Both sides' request counts as one (the progress bar shows the probe, not a side)."""
        if on_progress is None:
            return None

        def on_change(counts: Counts) -> None:
            self.counts[name] = counts
            fields = Counts.__dataclass_fields__
            on_progress(Counts(*(sum(getattr(c, f) for c in self.counts.values()) for f in fields)))

        return on_change


def _side(name: str, config) -> Side:
    """A's alone answer is the reference; B's run ids follow A's (reference + copies)."""
    copies = config.runs if config.runs is not None else DEFAULT_RUNS
    return Side(PREFIXES[name], name, 0 if name == "A" else copies + 1, reference=name == "A")


def _side_of(condition_id: str) -> str:
    return next(name for name, prefix in PREFIXES.items() if condition_id.startswith(prefix + "/"))


def _fingerprint(prints: dict[str, dict], endpoints: dict[str, str]) -> dict:
    """A's fingerprint, its load replaced by both sides' (each with the model it serves)."""
    fp = dict(prints["A"])
    fp["device"] = f"servers at {endpoints['A']} (A) and {endpoints['B']} (B)"
    fp["load"] = {"mode": "server", "endpoint": endpoints["A"], "against": endpoints["B"],
                  "sides": {name: {**p["load"], "model": p["model"]["name"]} for name, p in prints.items()}}
    return fp


def _notes(level: str) -> list[str]:
    return ["the reference is side A's request sent alone; each side's own divergence is measured from its "
            "own request sent alone (summary.json \"against\")", *level_notes(level)]
