"""Options shared by several commands, defined once as Annotated aliases."""

from pathlib import Path
from typing import Annotated, Optional

import typer

ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", "-m", help="Hugging Face causal LM: local directory or hub id (cached). Default: the embedded demo model.")]
DtypeOpt = Annotated[str, typer.Option(help="bfloat16 | float16 | float32.")]
DeviceOpt = Annotated[str, typer.Option(help="torch device, e.g. cpu or cuda:0.")]
AttnOpt = Annotated[Optional[str], typer.Option(
    "--attn-implementation", help="transformers attention implementation (sdpa, eager, ...). Default: the model's.")]
TrustOpt = Annotated[bool, typer.Option(
    "--trust-remote-code", help="Allow the model repository's own Python code to run (off by default).")]
PromptOpt = Annotated[Optional[str], typer.Option("--prompt", "-p", help="The target prompt text.")]
PromptFileOpt = Annotated[Optional[Path], typer.Option("--prompt-file", help="Read the target prompt from a file.")]
BatchSizesOpt = Annotated[str, typer.Option(
    "--batch-sizes", "-b", help="Batch sizes to sweep: '1,2,4,8' or ranges '1-32'. 1 (the reference) is always run.")]
MaxNewTokensOpt = Annotated[int, typer.Option("--max-new-tokens", "-n", help="Tokens generated per request.")]
KernelsOpt = Annotated[str, typer.Option(help="default | batch-invariant (nondet's invariant kernels).")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", "-o", help="Run directory to write (default nondet-runs/<time>-<command>).")]
ThreadsOpt = Annotated[Optional[int], typer.Option(help="torch CPU threads (results depend on it; recorded).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the machine-readable summary on stdout instead of tables.")]


def read_prompt(prompt: str | None, prompt_file: Path | None, default: str) -> str:
    """The prompt from --prompt, --prompt-file, or the default; errors are one line."""
    from nondet.errors import UsageError

    if prompt is not None and prompt_file is not None:
        raise UsageError("give either --prompt or --prompt-file, not both")
    if prompt_file is not None:
        try:
            prompt = prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read prompt file {prompt_file}: {getattr(exc, 'strerror', None) or exc}") from None
    if prompt is None:
        return default
    if not prompt.strip():
        raise UsageError("the prompt is empty; pass --prompt TEXT or --prompt-file FILE")
    return prompt


def read_lines_file(path: Path, what: str) -> tuple[str, ...]:
    """Non-empty lines of a text file (fillers), or a one-line UsageError."""
    from nondet.errors import UsageError

    try:
        lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {what} file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not lines:
        raise UsageError(f"{what} file {path} has no non-empty lines")
    return tuple(lines)
