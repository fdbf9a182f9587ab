"""Options shared by several commands, defined once as Annotated aliases."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

if TYPE_CHECKING:
    from nondet.prompt import Prompt

ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", "-m", help="Hugging Face causal LM: local directory or hub id (cached). Default: the embedded demo model.")]
DtypeOpt = Annotated[str, typer.Option(help="bfloat16 | float16 | float32.")]
DeviceOpt = Annotated[str, typer.Option(help="torch device, e.g. cpu or cuda:0.")]
AttnOpt = Annotated[Optional[str], typer.Option(
    "--attn-implementation", help="transformers attention implementation (sdpa, eager, ...). Default: the model's.")]
TrustOpt = Annotated[bool, typer.Option(
    "--trust-remote-code", help="Allow the model repository's own Python code to run (off by default).")]
InjectOpt = Annotated[Optional[bool], typer.Option(
    "--inject-variance/--no-inject-variance",
    help="Positive control: make one RMSNorm of the model batch-variant on purpose (nondet's batch-invariant "
         "norm fixes it), to check that a divergence is caught. On by default for the trained demo model only, "
         "so its effect shows on any CPU; --no-inject-variance probes it with this host's own kernels.")]
PromptOpt = Annotated[Optional[str], typer.Option("--prompt", "-p", help="The target prompt text.")]
PromptFileOpt = Annotated[Optional[Path], typer.Option("--prompt-file", help="Read the target prompt from a file.")]
BatchSizesOpt = Annotated[Optional[str], typer.Option(
    "--batch-sizes", "-b", help="Batch sizes to sweep: '1,2,4,8' or ranges '1-32'. 1 (the reference) is always run. "
                                "Default 1,2,4,8,16 (1,2,8 for the several built-in prompts).")]
MaxNewTokensOpt = Annotated[int, typer.Option("--max-new-tokens", "-n", help="Tokens generated per request.")]
KernelsOpt = Annotated[str, typer.Option(help="default | batch-invariant (nondet's invariant kernels).")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", "-o", help="Run directory to write (default nondet-runs/<time>-<command>).")]
def at_least_one(param: typer.CallbackParam, value: Optional[int]) -> Optional[int]:
    """A count flag (--threads, --max-new-tokens) below 1 is a usage error, not a silent default:
    torch would keep its own thread count while config.json says 0, and -n 0 would run 200 tokens."""
    from nondet.errors import UsageError

    if value is not None and value < 1:
        raise UsageError(f"{param.opts[0]} must be >= 1, not {value}")
    return value


ThreadsOpt = Annotated[Optional[int], typer.Option(
    help="torch CPU threads (results depend on it; recorded).", callback=at_least_one)]


def workers_count(param: typer.CallbackParam, value: Optional[str]) -> "int | str | None":
    """--workers N (>= 1) or auto (probes/static/auto_workers.py); anything else is a usage error."""
    from nondet.errors import UsageError
    from nondet.probes.static.workers import AUTO

    if value is None or value == AUTO:
        return value
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"{param.opts[0]} must be an integer >= 1 or auto, not {value!r}")
    return int(value)


WorkersOpt = Annotated[Optional[str], typer.Option(
    help="Static batches on the CPU: decode the conditions in N processes at once, each with --threads threads "
         "(default: the cores shared out); the run directory is one process's. auto: by the cores, the "
         "memory free for another copy of the weights and the sweep's length (1 where helpers cannot run or "
         "would not pay for their start-up). Default: auto for the gate, 1 for the probe.", callback=workers_count)]
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
    return check_utf8(prompt, "--prompt")


def check_utf8(text: str, flag: str) -> str:
    """Command-line text as Python received it: bytes that were not UTF-8 arrive as lone surrogates
    (surrogateescape), which no tokenizer takes; refuse them in one line, as --prompt-file does."""
    from nondet.errors import UsageError

    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = f"0x{ord(text[exc.start]) - 0xDC00:02x}" if 0xDC80 <= ord(text[exc.start]) <= 0xDCFF else "?"
        raise UsageError(f"{flag} is not UTF-8 text (byte {byte} at character {exc.start}); pass UTF-8, "
                         "or the prompt in a UTF-8 file with --prompt-file") from None
    return text


def read_targets(prompt: str | None, prompt_file: Path | None, prompts_file: Path | None,
                 several_by_default: bool) -> "tuple[Prompt, ...]":
    """The target prompts: --prompts FILE, else --prompt / --prompt-file, else the built-in ones
    (the demo's several prompts where the load can take them, else the one default prompt)."""
    from nondet.errors import UsageError
    from nondet.probes.core.corpus import DEMO_PROMPTS
    from nondet.probes.probe import DEFAULT_PROMPT

    if prompts_file is not None:
        if prompt is not None or prompt_file is not None:
            raise UsageError("give either --prompts or --prompt / --prompt-file, not both")
        from nondet.prompt_file import read_prompt_file

        return read_prompt_file(prompts_file)
    if prompt is None and prompt_file is None:
        return DEMO_PROMPTS if several_by_default else (DEFAULT_PROMPT,)
    return (read_prompt(prompt, prompt_file, DEFAULT_PROMPT),)


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
