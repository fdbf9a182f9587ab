"""`nondet kernels coverage` on the terminal: the op census of one model as a table."""

from collections import defaultdict

from rich.console import Console
from rich.table import Table

VERDICT_ORDER = ("uncovered", "routed", "row-independent")


def render_census(found, console: Console | None = None) -> None:
    """One row per (verdict, op): calls, how many modules, the first module, why; then the totals."""
    console = console or Console()
    table = Table(title=f"op census: {found.model_class} ({found.dtype}{', compiled' if found.compiled else ''})")
    for header in ("verdict", "op", "calls", "mods", "first module", "why"):
        table.add_column(header, overflow="fold")
    for (verdict, op), uses in sorted(_by_op(found.uses).items(), key=_order):
        first = uses[0].module or found.model_class
        if op == uses[0].why:
            op = ", ".join(sorted({u.op.split("::")[-1] for u in uses}))
        table.add_row(verdict, op, str(sum(u.calls for u in uses)), str(len({u.module for u in uses})), first,
                      uses[0].why)
    console.print(table)
    counts = found.counts()
    console.print(", ".join(f"{counts[v]} {v}" for v in VERDICT_ORDER) + " aten calls")
    verdict = "within rounding" if found.agrees() else "BEYOND rounding"
    console.print(f"logits, mode vs default kernels: largest difference {found.max_logit_diff:.3g} "
                  f"(allowed {found.tolerance:.3g}): {verdict}")


def _by_op(uses) -> dict:
    """Routed and uncovered ops one row each; row-independent ones, and the ops our own kernels run
    inside, one row per kind (elementwise, indexing, ...)."""
    grouped = defaultdict(list)
    for use in uses:
        by_kind = use.verdict == "row-independent" or use.why == "inside a nondet kernel"
        grouped[(use.verdict, use.why if by_kind else use.op)].append(use)
    return grouped


def _order(item) -> tuple:
    (verdict, op), _ = item
    return VERDICT_ORDER.index(verdict), op
