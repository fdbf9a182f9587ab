"""Tables that fit the terminal: the full table where it fits, else its narrow form.

A table wider than the terminal would have rich cut its headers ("distin…", "diverg…") and fold
module paths a few letters at a time. Each table that can be too wide at 80 columns (a default
terminal, or a log) has a narrow form instead, designed for it: short headers and a legend line
under the table saying what they stand for, or fewer columns with the rest named in the caption.
"""

from collections.abc import Callable

from rich.console import Console
from rich.table import Table


def fitted(console: Console, wide: Callable[[], Table], narrow: Callable[[], Table]) -> Table:
    """wide() where its natural width fits the console, else narrow()."""
    table = wide()
    return table if natural_width(console, table) <= console.width else narrow()


def natural_width(console: Console, table: Table) -> int:
    """The table's width with every cell on one line (columns)."""
    return console.measure(table, options=console.options.update_width(UNBOUNDED)).maximum


UNBOUNDED = 100_000  # a width to measure in: rich clamps a measurement to the width it is given
