"""The only errors the CLI shows to a user: one line each, with a distinct exit code.

Exit codes (also in the README):
  1  policy violated (nondet gate only)
  2  usage or configuration error (bad flag values, empty prompt, unreadable file)
  3  could not run: model missing or not loadable, a model the batch-invariant mode cannot
     cover, the model's logits NaN or +inf, out of memory, server unreachable,
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


class NonFiniteLogitsError(NondetError):
    """A recorded row's logits held NaN or +inf at a decode step: the model's numerics broke there (most often
    activations overflowing float16), so that step's token and logprob measure nothing, and every run would
    "agree" on the same garbage. The message names the step, the batch row, the model dtype where known and
    what to try. (-inf is not this: it is a masked vocabulary entry.)"""

    exit_code = 3

    def __init__(self, step: int | None, row: int | None, dtype: str | None = None) -> None:
        where = " at a recorded step" if step is None else f" at decode step {step}"
        where += "" if row is None else f", batch row {row}"
        super().__init__(f"the model's logits are NaN or +inf{where}{self._hint(dtype)}")
        self.step, self.row, self.dtype = step, row, dtype

    @staticmethod
    def _hint(dtype) -> str:
        """What to try: float16's range is the usual cause; in a wider dtype it is the weights or the model code."""
        name = None if dtype is None else str(dtype).removeprefix("torch.")
        if name == "float16":
            return " (model dtype float16): its activations overflow float16; try --dtype bfloat16 or float32"
        if name is None:
            return ": most often the model's activations overflow float16; try --dtype bfloat16 or float32"
        return f" (model dtype {name}): check the weights for NaN or inf, or try --dtype float32"


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


class NondetWarning(UserWarning):
    """A warning the CLI shows as one `nondet: warning:` line; a library caller sees a Python warning."""


class PartialRunWarning(NondetWarning):
    """A run directory was read in part (a record cut off mid-write was left out)."""


class UnusedWeightsWarning(NondetWarning):
    """The checkpoint holds tensors the model config.json builds does not use (a config of another size)."""


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
