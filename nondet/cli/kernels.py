"""`nondet kernels ...`: the batch-invariant kernels' own commands."""

import json
from pathlib import Path
from typing import Annotated

import typer

from nondet.cli.app import app
from nondet.cli.options import DeviceOpt, DtypeOpt, JsonOpt, ModelOpt, TrustOpt
from nondet.errors import UsageError

kernels_app = typer.Typer(help="Batch-invariant kernels: what they cover on a model, benchmark, tune.",
                          no_args_is_help=True)
app.add_typer(kernels_app, name="kernels")

SECTIONS = ("matmul", "rmsnorm", "decode", "e2e")


@kernels_app.command("bench")
def bench(
    out: Annotated[Path, typer.Option(help="Markdown file the table is written to (replaced).")] = Path(
        "kernels-bench.md"),
    only: Annotated[list[str] | None, typer.Option(help=f"Run only these sections: {', '.join(SECTIONS)}.")] = None,
    quick: Annotated[bool, typer.Option(help="Fewer shapes and a 4-layer model (a smoke run).")] = False,
    score: Annotated[bool, typer.Option(help="Time the fixed score shape set and end with `score=X`: the "
                                             "geometric mean of our/default throughput, 0 if any kernel "
                                             "was not bitwise batch-invariant in this run.")] = False,
) -> None:
    """Time our kernels against cuBLAS / torch / SDPA on this GPU and write a Markdown table.

    Every section also checks, in the same run, that our kernels are bitwise batch-invariant.

    Example: nondet kernels bench --score --out bench.md

    Exit codes: 0 done (a kernel that was not invariant shows in the table and in score=0), 2 no GPU or
    a bad flag, 3 out of memory, 70 internal error, 130 interrupted.
    """
    sections = tuple(only) if only else SECTIONS
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise UsageError(f"unknown section {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    if score and only:
        raise UsageError("--score times the whole fixed shape set; drop --only")
    import torch

    if not torch.cuda.is_available():
        raise UsageError("nondet kernels bench needs a CUDA GPU; none is visible (run it on a GPU machine)")
    from nondet.kernels import bench as kbench

    command = ("nondet kernels bench" + (" --quick" if quick else "") + (" --score" if score else "")
               + "".join(f" --only {s}" for s in (only or [])))
    out.parent.mkdir(parents=True, exist_ok=True)
    # the table is rewritten after every section, so a crash keeps what was measured
    report = kbench.run(command, quick=quick, sections=sections, score_set=score,
                        progress=lambda partial: out.write_text(kbench.to_markdown(partial)))
    if score:
        out.write_text(kbench.to_markdown(report) + f"\n{kbench.score_line(report, quick)}\n")
    typer.echo(kbench.to_markdown(report))
    typer.echo(f"wrote {out}")
    if score:
        typer.echo(kbench.score_line(report, quick))


@kernels_app.command("tune")
def tune(
    out: Annotated[Path | None, typer.Option(help="Where the tuned table goes (default: $NONDET_KERNEL_TUNING, "
                                                  "else ~/.cache/nondet/kernel-tuning.json, which the mode "
                                                  "loads on this device and library versions).")] = None,
) -> None:
    """Pick, per (K, N) and M bucket, the fastest matmul configuration that keeps the shipped bits.

    Only tiles, warps, stages and TMA move; the K reduction order never does, and a candidate is
    kept only if its rows equal the shipped dispatch's in raw bits. Runs in about a minute.

    Example: nondet kernels tune && nondet kernels bench --score

    Exit codes: 0 done, 2 no GPU or a bad flag, 3 out of memory, 70 internal error, 130 interrupted.
    """
    import torch

    if not torch.cuda.is_available():
        raise UsageError("nondet kernels tune needs a CUDA GPU; none is visible (run it on a GPU machine)")
    from nondet.kernels import config
    from nondet.kernels import tune as ktune

    results = ktune.tune(progress=lambda r: typer.echo(ktune.summary([r])[0]))
    path = out or config.tuning_path()
    ktune.write(results, path)
    typer.echo(ktune.summary(results)[-1])
    typer.echo(f"wrote {path}")


@kernels_app.command("coverage")
def coverage(
    model: ModelOpt = None,
    dtype: DtypeOpt = "bfloat16",
    device: DeviceOpt = "cpu",
    compiled: Annotated[bool, typer.Option(help="Census of the traced mode a compiled graph runs: only "
                                                "nondet:: ops count as covered.")] = False,
    trust_remote_code: TrustOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """What the batch-invariant mode covers on one model: its op census.

    One short forward (2 rows of 5 tokens, then one decode step) runs under the mode and every aten
    op is counted as routed (a batch-invariant kernel computes it), row-independent (elementwise,
    views, indexing: no reduction) or uncovered (a reduction the mode does not reach). The mode's
    logits are also compared with the default kernels'. Exits 3 when the mode would refuse the model.

    Example: nondet kernels coverage --model ./my-model --dtype float32

    Exit codes: 0 the mode covers the model, 2 bad flag, 3 the model cannot load or the mode would refuse
    it (an uncovered reduction), 70 internal error, 130 interrupted.
    """
    from nondet.cli.render_coverage import render_census
    from nondet.kernels.mode import census_of
    from nondet.probes.models.loading import ModelSpec, load_model
    from nondet.probes.core.kernel_coverage import census_entry

    loaded = load_model(ModelSpec(model, dtype, device, trust_remote_code=trust_remote_code, inject_variance=False))
    found = census_of(loaded.model, compiled)
    if as_json:
        typer.echo(json.dumps(found.to_json(), indent=2))
    else:
        render_census(found)
    census_entry(loaded.model, compiled, allow_uncovered=False)  # the mode's refusal, as a probe would meet it
