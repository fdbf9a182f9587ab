"""`nondet kernels ...`: the batch-invariant kernels' own commands."""

from pathlib import Path
from typing import Annotated

import typer

from nondet.cli.app import app
from nondet.errors import UsageError

kernels_app = typer.Typer(help="Batch-invariant kernels: benchmark them against the defaults.",
                          no_args_is_help=True)
app.add_typer(kernels_app, name="kernels")

SECTIONS = ("matmul", "rmsnorm", "decode", "e2e")


@kernels_app.command("bench")
def bench(
    out: Annotated[Path, typer.Option(help="Markdown file the table is written to.")] = Path("docs/benchmarks.md"),
    only: Annotated[list[str] | None, typer.Option(help=f"Run only these sections: {', '.join(SECTIONS)}.")] = None,
    quick: Annotated[bool, typer.Option(help="Fewer shapes and a 4-layer model (a smoke run).")] = False,
) -> None:
    """Time our kernels against cuBLAS / torch / SDPA on this GPU and write a Markdown table.

    Example: nondet kernels bench --out docs/benchmarks.md
    """
    sections = tuple(only) if only else SECTIONS
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise UsageError(f"unknown section {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    import torch

    if not torch.cuda.is_available():
        raise UsageError("nondet kernels bench needs a CUDA GPU; none is visible (run it on a GPU machine)")
    from nondet.kernels import bench as kbench

    command = "nondet kernels bench" + (" --quick" if quick else "") + "".join(f" --only {s}" for s in (only or []))
    out.parent.mkdir(parents=True, exist_ok=True)
    # the table is rewritten after every section, so a crash keeps what was measured
    report = kbench.run(command, quick=quick, sections=sections,
                        progress=lambda partial: out.write_text(kbench.to_markdown(partial)))
    typer.echo(kbench.to_markdown(report))
    typer.echo(f"wrote {out}")
