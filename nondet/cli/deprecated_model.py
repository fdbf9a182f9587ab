"""The model as a positional argument (`nondet gate DIR`, `nondet rl DIR`): deprecated and hidden.

--model/-m names the model on every command. gate and rl used to take it positionally; that
spelling still runs, so CI lines written for it keep working, but --help no longer shows it
(usage line included) and each use prints one warning line on stderr.
"""

import sys
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand

from nondet.errors import UsageError

WARNING = "nondet: the model as a positional argument is deprecated; use --model DIR"

ModelArg = Annotated[Optional[str], typer.Argument(hidden=True, show_default=False)]


class HiddenArgumentsCommand(TyperCommand):
    """A command whose usage line leaves hidden arguments out, as its help panels already do
    (click lists every argument in the usage line, hidden or not)."""

    def collect_usage_pieces(self, ctx):
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if not getattr(param, "hidden", False):
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


def model_of(positional: str | None, model: str | None) -> str | None:
    """--model's value, or the deprecated positional one (with the warning); both, with different
    values, is a one-line usage error rather than a silent pick."""
    if positional is None:
        return model
    if model is not None and model != positional:
        raise UsageError(f"the model is given twice: {positional!r} as a positional argument and {model!r} as "
                         "--model; give --model DIR only")
    print(WARNING, file=sys.stderr)
    return positional
