"""The Source interface: what the probe loop asks of every way of producing target streams.

A source is built from a ProbeConfig. The loop calls, in order:
    open()                load the model / identify the server; returns Opened (fingerprint)
    attach(writer)        the run directory's one writer (not called for an in-memory probe)
    plan()                the conditions, in the order they run
    replay(planned, emit) run one condition; emit(StreamRecord) each target stream as it
                          arrives (the loop writes it at once); returns its ConditionRecord
    summarize(streams)    the Summary of all streams (on-disk dicts, resumed ones included)
    close()               release the model / engine / connections (always, in finally)
A source may use the writer only to amend the header it described (a server identity learnt
late, a resume's record); streams and conditions go through emit and replay's return value.
`step_record` turns the recorder's step dicts into the StepRecords every source emits.
"""

from dataclasses import dataclass
from typing import Callable, Protocol

from nondet.rundir.records import ConditionRecord, StepRecord, StreamRecord, Summary

Emit = Callable[[StreamRecord], None]


@dataclass(frozen=True)
class Opened:
    fingerprint: dict | None  # fingerprint.json; None = the run directory already has its header (resume)
    run_dir: str | None = None  # a run directory the source must use (a resume's), else None


@dataclass(frozen=True)
class Planned:
    """One condition before it runs: an id and label for progress, and the source's own plan."""

    condition_id: str
    label: str
    kernels: str
    plan: object  # the source's own description (a Condition, a run index, a request range)


class Source(Protocol):
    kind: str  # "static" | "continuous" | "server": the "load" written on its records

    def open(self) -> Opened: ...

    def attach(self, writer) -> None: ...

    def plan(self) -> list[Planned]: ...

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord: ...

    def summarize(self, streams: list[dict]) -> Summary: ...

    def close(self) -> None: ...


def step_record(step: dict, piece: str) -> StepRecord:
    """A recorder step dict (token, logprob, top, margin as float.hex) with its piece."""
    known = ("token", "logprob", "top", "margin")
    return StepRecord(token=step["token"], piece=piece, logprob=step.get("logprob"), margin=step.get("margin"),
                      top=step.get("top"), extra={k: v for k, v in step.items() if k not in known + ("piece",)})
