"""Background filler traffic for the server probe: a seeded Poisson process of other requests.

One thread walks the arrival schedule (seconds after start) and hands each filler to a small
pool; the fillers' answers are counted, not stored. Filler failures never stop the probe.
`stop()` cancels the fillers not yet sent and waits for those in flight (each bounded by
the client's timeout and retries).
"""

import threading
from concurrent.futures import ThreadPoolExecutor

from nondet.errors import NondetError
from nondet.probes.core.arrivals import Arrival


class FillerTraffic:
    def __init__(self, send, schedule: list[Arrival], texts: tuple[str, ...], workers: int, tally):
        self._send, self._schedule, self._texts, self._tally = send, schedule, texts, tally
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="nondet-filler")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._walk, name="nondet-traffic", daemon=True)

    def start(self) -> "FillerTraffic":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _walk(self) -> None:
        elapsed = 0.0
        for arrival in self._schedule:
            if self._stopped.wait(arrival.at - elapsed):
                return
            elapsed = arrival.at
            self._pool.submit(self._one, arrival)

    def _one(self, arrival: Arrival) -> None:
        self._tally.sent()
        try:
            self._send(self._texts[arrival.filler], arrival.max_new_tokens)
        except NondetError:
            self._tally.gave_up()
            return
        self._tally.answered(target=False)
