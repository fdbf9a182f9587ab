"""The `nondet` process ends without the interpreter's teardown once its command is done.

After a command returns, Python frees every object still alive (the model, compiled graphs and their
caches, CUDA's state) before the process ends: 1.1 s after the last exit handler of a warm `probe
--compile` on a 2-core CPU, 4.5 s after a cold one (2026-11-30), on every run of the command and of a
CI gate. Here the ending is what the interpreter would do first, in its order: wait for the threads
that are not daemons (`threading._shutdown`), run the exit handlers (`atexit`), flush stdout and
stderr; then `os._exit` with the command's code, which skips only the freeing. Files the command wrote
are closed by then (the run directory's writers close their own); the operating system frees memory,
CUDA contexts and file descriptors as it does for any ending process.

Only the console entry (`nondet`, `python -m nondet`) ends so; `app.main()` called in a process that
goes on (tests, scripts) returns or raises as before. NONDET_FAST_EXIT=0 ends the usual way; so does a
Python without the two private functions (the ending is then the usual one).
"""

import atexit
import os
import sys
import threading

ENV = "NONDET_FAST_EXIT"


def end(code: int) -> None:
    """End the process with `code`, as the interpreter would but without freeing what is still alive."""
    shutdown_threads = getattr(threading, "_shutdown", None)
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if os.environ.get(ENV) == "0" or shutdown_threads is None or run_exit_handlers is None:
        sys.exit(code)
    shutdown_threads()
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`nondet ... | head`): nothing more to write
            pass
    os._exit(code)
