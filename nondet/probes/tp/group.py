"""Start, supervise and stop one worker group; a rank that dies or fails stops every rank.

Ranks are spawned processes (CUDA needs spawn; CPU uses it too, so both run the same way),
each with its own pipe to the parent (pipes hold no semaphores, so a killed rank leaks none).
The parent waits on the pipes with a short timeout and, between waits, checks that every rank
is alive: a rank that exits early leaves the others blocked in a collective (gloo and NCCL
wait for minutes), so the parent terminates them at once, then kills what is left.
"""

import socket
import time

from nondet.errors import ModelLoadError, NondetError, OutOfMemoryError, UsageError, WorkerError
from nondet.probes.core.child_process import start_without_sigint, stop_processes
from nondet.probes.tp.job import Job

POLL_SECONDS = 0.5  # how often the parent checks that every rank is alive while it waits
STOP_SECONDS = 5.0  # grace after SIGTERM before SIGKILL
SETTLE_SECONDS = 1.0  # after one rank's error: time for a rank that crashed first to be seen dead

_ERRORS = {"UsageError": UsageError, "ModelLoadError": ModelLoadError, "OutOfMemoryError": OutOfMemoryError}


class WorkerGroup:
    def __init__(self, job: Job) -> None:
        import torch.multiprocessing as mp

        from nondet.probes.tp import worker

        self.job = job
        context = mp.get_context("spawn")
        pipes = [context.Pipe(duplex=False) for _ in range(job.degree)]
        self.conns = [receive for receive, _ in pipes]  # the pipes still open
        self.rank0 = self.conns[0]  # results come from rank 0 alone
        # daemon: should the parent exit without close(), multiprocessing still stops the ranks
        self.processes = [context.Process(target=worker.main, args=(rank, job, send), daemon=True,
                                          name=f"nondet-tp{job.degree}-rank{rank}")
                          for rank, (_, send) in enumerate(pipes)]
        start_without_sigint(self.processes)
        for _, send in pipes:
            send.close()  # the parent keeps only the reading ends: EOF then means the rank is gone
        self.errors: list[tuple] = []

    def next(self, expect: str) -> tuple:
        """Rank 0's next message, which must be `expect` ("ready", "condition", "done"); a rank's
        failure or death stops the group and raises one NondetError."""
        from multiprocessing.connection import wait

        while True:
            for conn in wait(self.conns, timeout=POLL_SECONDS):
                message = self._receive(conn)
                if message and message[0] == "error":
                    self.errors.append(message)
                elif message and conn is self.rank0 and message[0] == expect:
                    return message
            if self.errors:
                raise self._stop(self._error(self.errors[0]))
            self._check_alive()
            if self.rank0 not in self.conns and self.processes[0].exitcode is not None:
                self.close()  # rank 0 left (even with exit code 0) without sending what we wait for
                raise died(0, self.job.degree, self.processes[0].exitcode)

    def _receive(self, conn):
        try:
            return conn.recv()
        except (EOFError, OSError):  # the rank closed its pipe: it exited (checked by _check_alive)
            self.conns = [c for c in self.conns if c is not conn]
            return None

    def close(self) -> None:
        """Stop every rank still running (SIGTERM, then SIGKILL) and reap them all."""
        stop_processes(self.processes, STOP_SECONDS)
        for conn in self.conns:
            conn.close()
        self.conns = []

    def finish(self) -> tuple:
        """After the last condition: rank 0's "done" message (returned), then every rank exits on its
        own; reap them."""
        done = self.next("done")
        deadline = time.monotonic() + 60.0
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        self.close()
        return done

    def _check_alive(self) -> None:
        dead = self._died()
        if dead:
            self.close()
            rank, code = dead[0]
            raise died(rank, self.job.degree, code)

    def _died(self) -> list[tuple[int, int]]:
        """Ranks that exited with a failure code."""
        return [(rank, p.exitcode) for rank, p in enumerate(self.processes) if p.exitcode not in (None, 0)]

    def _stop(self, error: NondetError) -> NondetError:
        """A rank that crashed silently is the cause of its peers' collective errors: name it."""
        from multiprocessing.connection import wait

        time.sleep(SETTLE_SECONDS)
        for conn in wait(self.conns, timeout=0):
            message = self._receive(conn)
            if message and message[0] == "error":
                self.errors.append(message)
        reporting = {message[1] for message in self.errors}
        silent = [(rank, code) for rank, code in self._died() if rank not in reporting]
        self.close()
        if silent:
            rank, code = silent[0]
            return died(rank, self.job.degree, code)
        return error

    def _error(self, message: tuple) -> NondetError:
        _, rank, kind, text = message
        error = _ERRORS.get(kind, WorkerError)
        prefix = "" if error is not WorkerError else f"tensor-parallel worker rank {rank} failed: {kind}: "
        return error(f"{prefix}{text}")


def died(rank: int, degree: int, code: int) -> WorkerError:
    """The one line for a rank that exited without a message (killed, crashed, os._exit)."""
    return WorkerError(f"tensor-parallel worker rank {rank} of {degree} died (exit code {code}); "
                       "all ranks were stopped")


def free_port() -> int:
    """A TCP port free on loopback now, for the group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
