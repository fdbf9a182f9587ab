"""Thread-safe request counts for the server probe's progress bar: done, in flight, failed."""

import threading
from dataclasses import dataclass, replace
from typing import Callable


@dataclass(frozen=True)
class Counts:
    total: int  # target requests of the probe (reference + copies), resumed ones included
    done: int = 0  # target requests answered and on disk
    in_flight: int = 0  # target and filler requests sent and not yet answered
    failed: int = 0  # failed attempts, targets and fillers (retried ones included)
    fillers_done: int = 0


class Tally:
    def __init__(self, total: int, done: int, on_change: Callable[[Counts], None] | None = None):
        self._counts = Counts(total, done)
        self._lock = threading.Lock()
        self._on_change = on_change or (lambda _c: None)

    def _bump(self, **deltas: int) -> None:
        with self._lock:
            c = self._counts
            self._counts = replace(c, **{k: getattr(c, k) + v for k, v in deltas.items()})
            counts = self._counts
        self._on_change(counts)

    def sent(self) -> None:
        self._bump(in_flight=1)

    def answered(self, target: bool) -> None:
        self._bump(in_flight=-1, **({"done": 1} if target else {"fillers_done": 1}))

    def gave_up(self) -> None:
        self._bump(in_flight=-1)

    def failed_attempt(self, _detail: str = "") -> None:
        self._bump(failed=1)

    @property
    def counts(self) -> Counts:
        with self._lock:
            return self._counts
