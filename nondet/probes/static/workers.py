"""--workers N: a static probe's conditions decoded by N processes at once, on the CPU.

Why: on a CPU the step of a small model is per-op cost in one Python thread (the embedded model's
batch-1 step: 3.7 ms with 2 threads, 3.9 ms with 1, on a 2-core AMD EPYC, 2026-11-30), so a second
thread barely helps and a second process nearly doubles the calls per second. A probe's generate
calls are independent, so N processes with `threads` torch threads each decode them side by side.

What stays the same: every process loads the same model with the same thread count and runs whole
conditions (a condition never splits) through the same `replay_condition`; the parent writes their
rows in plan order, so the run directory is the one a single process writes, run ids included
(tests/test_static_workers.py compares them bit for bit). The thread count is the run's: results
depend on it (core/numerics.py), so --workers without --threads gives each process its share of
the cores, and fingerprint.json records both.

Scheduling: the parent decodes from the front of the plan as the probe loop asks, the helpers claim
from the back (one lock, in the parent): no condition runs twice and no process idles while one is
left. With --fail-fast a batch is claimed only once its references are decoded, and they are sent
with it (static/fail_fast.py): a helper then takes the last condition that is ready, references
first at the start, and waits while none is. Helpers talk to the parent over pipes (no cross-process
semaphores for a killed helper to leak); one dispatcher thread in the parent serves them while the
main thread decodes.
"""

import os
import threading
from dataclasses import dataclass

from nondet.errors import ModelLoadError, NondetError, OutOfMemoryError, UsageError, WorkerError, debug_enabled
from nondet.probes.core.child_process import start_without_sigint, stop_processes, usable_cores

AUTO = "auto"  # --workers auto: the number auto_workers.py picks for the host
FAIL_ENV = "NONDET_WORKER_FAIL"  # test hook: helper N (1-based) exits with code 17 before its first condition
_ERRORS = {"ModelLoadError": ModelLoadError, "OutOfMemoryError": OutOfMemoryError, "UsageError": UsageError}
POLL_SECONDS = 0.5  # how often a waiting parent checks that the helpers are alive
STOP_SECONDS = 5.0  # grace after SIGTERM before SIGKILL
# the parent decodes from the front while helpers claim from the back; tests set False so that every
# condition goes to the helpers, whatever their start-up time (a tiny model's sweep ends before they load)
PARENT_DECODES = True


@dataclass(frozen=True)
class HelperJob:
    """What a helper process needs: pickled to it when it starts."""

    spec: object  # models.loading.ModelSpec
    conditions: tuple  # conditions.Condition, the whole plan (the parent sends indexes into it)
    inputs: tuple  # per prompt: (target ids, filler ids), tokenized once by the parent
    settings: object  # replay.DecodeSettings (eager)
    threads: int  # torch CPU threads, the parent's
    number: int  # 1-based, for messages


def validate(config) -> None:
    """--workers runs eager static batches on the CPU: refused now, before any model loads. auto never is
    (it is 1 where helpers cannot run: auto_workers.py)."""
    if config.workers == AUTO:
        return
    if config.workers < 1:
        raise UsageError("--workers must be an integer >= 1")
    refusal = why_not_here(config) if config.workers > 1 else None
    if refusal is not None:
        raise UsageError(refusal)


def why_not_here(config) -> str | None:
    """Why helper processes cannot decode this probe (the one line --workers N gets), or None."""
    if (config.load.mode != "static" or config.speculative or config.tp or config.compile_backend
            or config.budget is not None):
        return ("--workers decodes static batches eagerly in several processes; drop --load / --endpoint / "
                "--speculative / --tp / --compile / --budget")
    if config.model.device != "cpu":
        return "--workers runs on the CPU (one process per core); on a GPU drop it"
    return None


def threads_per_worker(threads: int | None, workers: int) -> int | None:
    """The thread count of every process: the one asked for, else the cores shared out (at least 1);
    one process keeps torch's own default (None)."""
    if threads or workers == 1:
        return threads
    return max(1, usable_cores() // workers)


class ConditionWorkers:
    """N - 1 helper processes beside the parent; `rows(index, decode_here)` gives a condition's rows.
    fail_fast: the source's FailFast (static/fail_fast.py), or None."""

    def __init__(self, job_fields: dict, conditions: list, workers: int, fail_fast=None) -> None:
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")  # no fork of a process holding torch's thread pools
        self.conditions = conditions
        self.fail_fast = fail_fast
        self.unclaimed = set(range(len(conditions)))  # the parent takes its next one, helpers the last ready one
        self.idle: list = []  # helpers' pipes waiting for a condition that is ready (--fail-fast)
        self.lock = threading.Condition()
        self.results: dict[int, dict] = {}  # index -> rows, from helpers
        self.counts = [0] * workers  # conditions decoded, parent first
        self.error: NondetError | None = None
        pipes = [context.Pipe() for _ in range(workers - 1)]
        self.conns = [parent_end for parent_end, _ in pipes]
        self.processes = [context.Process(target=helper_main, args=(HelperJob(**job_fields, conditions=tuple(conditions),
                                                                              number=n + 1), child_end),
                                          daemon=True, name=f"nondet-worker{n + 1}")
                          for n, (_, child_end) in enumerate(pipes)]
        start_without_sigint(self.processes)
        for _, child_end in pipes:
            child_end.close()  # EOF on a parent end then means its helper is gone
        self.dispatcher = threading.Thread(target=self._dispatch, daemon=True, name="nondet-workers")
        self.dispatcher.start()

    def rows(self, index: int, decode_here) -> dict[int, list[dict]]:
        """Condition `index`'s rows: decoded here by decode_here() when no helper claimed it, else the
        helper's (waited for). A helper's failure raises its one line here. With --fail-fast a batch whose
        references a helper is still decoding waits for them (the plan puts every reference before it)."""
        with self.lock:
            while self._waits_for_references(index):
                self.lock.wait(POLL_SECONDS)
            local = PARENT_DECODES and index in self.unclaimed and self.error is None
            if local:
                self.unclaimed.discard(index)
        if local:
            rows = decode_here()
            self.counts[0] += 1
            self._decoded(index, rows)
            return rows
        with self.lock:
            while index not in self.results and self.error is None:
                self.lock.wait(POLL_SECONDS)
            if index not in self.results:
                raise self.error
            return self.results.pop(index)

    def _waits_for_references(self, index: int) -> bool:
        return (PARENT_DECODES and self.error is None and index in self.unclaimed
                and not self._ready(index))

    def _ready(self, index: int) -> bool:
        return self.fail_fast is None or self.fail_fast.ready(self.conditions[index])

    def _decoded(self, index: int, rows: dict) -> None:
        """A condition's rows are in: a reference may make batches ready for idle helpers."""
        with self.lock:
            if self.fail_fast is not None:
                self.fail_fast.record(self.conditions[index], rows)
                self._serve_idle()
            self.lock.notify_all()

    def summary(self) -> dict:
        """summary.json "workers": processes and how many conditions each decoded (the parent first)."""
        return {"processes": len(self.counts), "conditions_decoded": list(self.counts)}

    def close(self) -> None:
        """Stop every helper now (SIGTERM, then SIGKILL) and reap them: at the end of a run each is idle,
        told to stop or still loading (a short sweep ends first); after a failure or Ctrl-C its
        condition is not wanted."""
        with self.lock:
            self.error = self.error or WorkerError("the probe's worker processes were stopped")
            self.idle.clear()
            self.lock.notify_all()
        stop_processes(self.processes, STOP_SECONDS)
        self.dispatcher.join(STOP_SECONDS)  # it sees the error within one poll; then no one reads the pipes
        for conn in self.conns:
            conn.close()

    def _dispatch(self) -> None:
        """Serve the helpers: store what each sends, hand it the next claim from the back, or stop it."""
        from multiprocessing.connection import wait

        live = {conn: n for n, conn in enumerate(self.conns, start=1)}
        while live and self.error is None:
            for conn in wait(list(live), timeout=POLL_SECONDS):
                number = live[conn]
                try:
                    message = conn.recv()
                    if message[0] == "rows":
                        self._store(message[1], message[2], number)
                    if message[0] != "error":
                        if not self._claim_next(conn):
                            live.pop(conn)  # told to stop: its exit is expected
                        continue
                    error = _error(message)
                except (EOFError, OSError):  # the helper is gone without a message
                    error = self._died(number)
                live.pop(conn)
                self._fail(error, conn)

    def _died(self, number: int) -> WorkerError:
        process = self.processes[number - 1]
        process.join(STOP_SECONDS)  # reaped, so its exit code is known
        return died(number, process.exitcode)

    def _store(self, index: int, rows: dict, number: int) -> None:
        with self.lock:
            self.results[index] = rows
            self.counts[number] += 1
        self._decoded(index, rows)

    def _claim_next(self, conn) -> bool:
        """Send the helper the last unclaimed condition that is ready (True, also when it waits among the
        idle for one to become ready), or tell it to stop (False)."""
        with self.lock:
            if self.unclaimed and self.error is None:
                self.idle.append(conn)
                self._serve_idle()
                return True
        conn.send(("stop",))
        return False

    def _serve_idle(self) -> None:
        """Under the lock: each idle helper gets the last ready unclaimed condition, with its references."""
        while self.idle:
            ready = [i for i in self.unclaimed if self._ready(i)]
            if not ready:
                return
            index = max(ready)
            self.unclaimed.discard(index)
            settle = self.fail_fast.settle(self.conditions[index]) if self.fail_fast is not None else None
            self.idle.pop(0).send(("run", index, settle))

    def _fail(self, error: NondetError, conn) -> None:
        with self.lock:
            self.error = self.error or error
            self.lock.notify_all()
        conn.close()


def helper_main(job: HelperJob, pipe) -> None:
    """A helper process (spawned): load the model, then decode each condition the parent sends.
    Every failure becomes one ("error", ...) message and exit 1, no traceback unless NONDET_DEBUG=1.
    Ctrl-C is the parent's: a helper ignores SIGINT (child_process.start_without_sigint) and is stopped by it."""
    from nondet.probes.core.child_process import one_line, quiet, watch_parent

    quiet()
    watch_parent(os.getppid())
    try:
        _decode_claims(job, pipe)
    except BaseException as exc:  # noqa: BLE001 - the parent turns it into one line
        if debug_enabled():
            import traceback

            traceback.print_exc()
        try:
            pipe.send(("error", job.number, type(exc).__name__, one_line(exc)))
        except (OSError, ValueError):
            pass
        os._exit(1)
    pipe.close()


def _decode_claims(job: HelperJob, pipe) -> None:
    from nondet.probes.core.numerics import numerics_scope
    from nondet.probes.models.loading import load_model
    from nondet.probes.core.replay import replay_condition

    with numerics_scope(job.threads):
        loaded = load_model(job.spec)
        if os.environ.get(FAIL_ENV) == str(job.number):
            os._exit(17)
        prompts = [list(target) for target, _ in job.inputs]
        pipe.send(("ready",))
        while (message := pipe.recv())[0] == "run":
            index = message[1]
            condition = job.conditions[index]
            target, fillers = job.inputs[condition.prompt_id]
            rows = replay_condition(loaded.model, loaded.tokenizer, condition, list(target),
                                    [list(f) for f in fillers], job.settings, prompts, settle=message[2])
            pipe.send(("rows", index, rows))


def _error(message: tuple) -> NondetError:
    _, number, kind, text = message
    error = _ERRORS.get(kind, WorkerError)
    return error(text if error is not WorkerError else f"worker process {number} failed: {kind}: {text}")


def died(number: int, code: int | None) -> WorkerError:
    """The one line for a helper that exited without a message (killed, crashed, os._exit)."""
    return WorkerError(f"worker process {number} died (exit code {code}); the probe's workers were stopped")
