"""The `nondet` command: a typer app with one module per command and one error boundary.

Command modules register themselves here; this file imports no torch, so `nondet --help`
stays fast. Heavy imports happen inside each command's function body.
"""

import sys

import typer

from nondet.errors import NondetError, debug_enabled, is_out_of_memory

HELP = """Find, explain and prove the fix for batch-variance nondeterminism in LLM inference.

Start with `nondet probe` (embedded demo model) or `nondet probe --model DIR`.

Exit codes: 0 ok, 1 gate policy violated, 2 usage error, 3 could not run (model, memory, server),
4 bad run directory, 5 bad server response, 70 internal error, 130 interrupted (Ctrl-C)."""

app = typer.Typer(
    name="nondet",
    help=HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    pass  # the app's help is HELP: typer shows the Typer's help, not this docstring


def _register_commands() -> None:
    # Each module defines its command(s) on `app` (or a sub-app) at import time.
    from nondet.cli import probe  # noqa: F401

    for optional in ("bisect", "report", "compare", "gate", "kernels", "rl"):
        try:
            __import__(f"nondet.cli.{optional}")
        except ModuleNotFoundError as exc:
            if exc.name != f"nondet.cli.{optional}":
                raise
    from nondet.cli.helptext import reflow_commands

    reflow_commands(app)


# a command that writes a run directory names it itself (probe, gate, rl raise Interrupted); this line is for
# the others, which may have written nothing
INTERRUPTED = "interrupted (Ctrl-C)"


def run() -> None:
    """The console entry (`nondet`, `python -m nondet`): main(), then the process ends with its code without
    the interpreter's teardown (fast_exit.py). A SystemExit with a message, or an exception let through
    (NONDET_DEBUG=1), ends the usual way."""
    from nondet.cli import fast_exit

    try:
        main()
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            raise
        fast_exit.end(exc.code or 0)
    fast_exit.end(0)


def main() -> None:
    """Run the app behind the one error boundary: returns, or raises SystemExit with the exit code."""
    _show_partial_run_warnings()
    from nondet.probes.core.cache_dir import triton_cache

    try:
        _register_commands()
        with triton_cache():  # the mode's Triton binaries kept with nondet's cache (CI workflows keep it)
            code = app(standalone_mode=False)
    except NondetError as exc:
        _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        _fail(INTERRUPTED, 130)
    except Exception as exc:  # noqa: BLE001 - the boundary: never a traceback by default
        handled = _handle_click_exception(exc)
        if handled is None and is_out_of_memory(exc):
            detail = ": ".join(filter(None, (type(exc).__name__, _first_line(exc))))
            _fail(f"out of memory ({detail}); results already written stay in the run directory", 3)
        if handled is None:
            _fail(f"internal error: {type(exc).__name__}: {exc} (NONDET_DEBUG=1 shows the traceback)", 70)
        sys.exit(handled)
    _exit_with(code)


def _exit_with(code) -> None:
    """What app() returned outside standalone mode. typer catches a KeyboardInterrupt raised in a command
    (Ctrl-C) and returns 130 (its Exit(130)) instead of raising it, and returns n for typer.Exit(n); a
    command that finishes returns None. So 130 is the interrupt, any other integer the exit code."""
    if code == 130:
        _fail(INTERRUPTED, 130)
    if isinstance(code, int) and code != 0:
        sys.exit(code)


def _show_partial_run_warnings() -> None:
    """A NondetWarning (a torn record left out, checkpoint tensors a model does not use) is one `nondet:
    warning:` line on stderr; every other warning shows as Python shows it."""
    import warnings

    from nondet.errors import NondetWarning

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, NondetWarning):
            print(f"nondet: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def _handle_click_exception(exc: Exception) -> int | None:
    """typer's parse errors (bad flags) carry their own exit code and message."""
    show = getattr(exc, "show", None)
    exit_code = getattr(exc, "exit_code", None)
    if callable(show) and isinstance(exit_code, int):
        if debug_enabled():
            raise exc
        show()
        return exit_code
    if type(exc).__name__ == "Abort":  # click's Ctrl-C or end of input at a prompt
        _fail("aborted (Ctrl-C or end of input)", 130)
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _fail(message: str, code: int) -> None:
    if debug_enabled() and sys.exc_info()[1] is not None:
        _show_whole_chain(sys.exc_info()[1])
        raise
    print(f"nondet: error: {message}", file=sys.stderr)
    sys.exit(code)


def _show_whole_chain(exc: BaseException | None) -> None:
    """Undo `raise ... from None` along the chain, so the debug traceback shows the original frame."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__suppress_context__ = False
        exc = exc.__cause__ or exc.__context__
