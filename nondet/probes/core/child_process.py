"""The spawned processes of a probe (a tensor-parallel rank, a --workers helper): what each does first
(quiet the libraries, exit with its parent, report a failure as one line) and how the parent stops them."""

import os
import signal
import threading
import time


def usable_cores() -> int:
    """The cores this process may run on: its affinity (taskset, a CI runner's cpuset), not the host's count,
    so N processes of cores // N threads do not oversubscribe a runner that sees a bigger host."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def watch_parent(parent: int) -> None:
    """Exit when the parent is gone (killed before it could stop us): no orphaned worker waits forever."""

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def quiet() -> None:
    # transformers' load-time notices would interleave from N processes; errors still reach the parent.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import warnings

    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    hf_logging.disable_progress_bar()


def one_line(exc: BaseException, limit: int = 400) -> str:
    """The exception's first line, at most `limit` characters (its type's name where it says nothing)."""
    text = str(exc).strip().splitlines()
    return text[0][:limit] if text else type(exc).__name__


def stop_processes(processes, grace: float) -> None:
    """Stop every process still running (SIGTERM, then SIGKILL after `grace` seconds) and reap them all."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(grace)
        if process.is_alive():
            process.kill()
            process.join()


def start_without_sigint(processes) -> None:
    """Start the processes with SIGINT ignored (kept across their exec): a shell's Ctrl-C reaches the whole
    process group, and a child still importing torch would print its KeyboardInterrupt's traceback. The
    parent alone handles Ctrl-C and stops them (stop_processes)."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers are the main thread's
        for process in processes:
            process.start()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for process in processes:
            process.start()
    finally:
        signal.signal(signal.SIGINT, previous)
