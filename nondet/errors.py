"""The only errors the CLI shows to a user: one line each, with a distinct exit code.

Exit codes (also in the README):
  1  policy violated (nondet gate only)
  2  usage or configuration error (bad flag values, empty prompt, unreadable file)
  3  could not run: model missing or not loadable, a model the batch-invariant mode cannot
     cover, out of memory, server unreachable,
     a tensor-parallel worker died
  4  bad run directory (missing or malformed files)
  5  server answered, but with an unusable response (HTTP error, malformed JSON)
  130 interrupted (Ctrl-C): what was already written stays on disk, in an unfinished run directory
"""

import os
import sys
import traceback


class NondetError(Exception):
    """Base class. `exit_code` is what the CLI exits with; the message is one line."""

    exit_code = 2


class UsageError(NondetError):
    """A flag, config value or input file the user gave is not usable."""

    exit_code = 2


class ModelLoadError(NondetError):
    """The model (or tokenizer) could not be found or loaded."""

    exit_code = 3


class UnsupportedModelError(NondetError):
    """The batch-invariant mode cannot cover a module of this model (the message names it)."""

    exit_code = 3


class OutOfMemoryError(NondetError):
    """The device ran out of memory; results already written stay on disk."""

    exit_code = 3


class ServerUnreachableError(NondetError):
    """A live server refused the connection, timed out or hung."""

    exit_code = 3


class WorkerError(NondetError):
    """A tensor-parallel worker process failed or died; every rank of its group was stopped."""

    exit_code = 3


class RunDirError(NondetError):
    """A run directory is missing, incomplete or malformed."""

    exit_code = 4


class NothingToBisect(RunDirError):
    """Every run of a finished probe matched its reference: nothing diverged, so nothing to bisect. A good run,
    not a bad one: the CLI prints the line and exits 0 (a RunDirError for library callers that catch those)."""


class ServerResponseError(NondetError):
    """A live server answered with an HTTP error or a malformed body."""

    exit_code = 5


class Interrupted(NondetError):
    """Ctrl-C (SIGINT) stopped a run; the message names where what was written stays."""

    exit_code = 130


class PartialRunWarning(UserWarning):
    """A run directory was read in part (a record cut off mid-write was left out); the CLI shows it as
    one `nondet: warning:` line, a library caller as a Python warning."""


_OOM_MESSAGES = ("can't allocate memory", "out of memory")  # torch CPU allocator; CUDA/HIP/MPS allocators


def is_out_of_memory(exc: BaseException) -> bool:
    """True for every way an allocator says it ran out: torch.OutOfMemoryError (a device),
    RuntimeError "DefaultCPUAllocator: can't allocate memory" (torch on CPU), MemoryError (Python)."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MESSAGES)


def debug_enabled() -> bool:
    """NONDET_DEBUG=1: tracebacks and the libraries' own warnings are shown."""
    return os.environ.get("NONDET_DEBUG") == "1"


def debug_traceback(exc: BaseException) -> None:
    """Under NONDET_DEBUG=1, the whole traceback of a failure the run goes on from (a compile that fell back,
    a trace done again): what the run keeps of it is one line, and the cause can be deep inside torch."""
    if debug_enabled():
        traceback.print_exception(exc, file=sys.stderr)
