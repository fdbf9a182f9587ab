"""Load a causal LM and its tokenizer: the embedded default, a local directory or a hub id.

Every path goes through from_pretrained, so the embedded default exercises the same code
as a user's model. Errors become one-line ModelLoadError / UsageError.
"""

from dataclasses import dataclass
from pathlib import Path

from nondet.errors import ModelLoadError, OutOfMemoryError, UsageError, is_out_of_memory

DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class ModelSpec:
    name: str | None = None  # local dir or hub id; None = the embedded default
    dtype: str = "bfloat16"  # the default model is bf16; batch variance is largest there
    device: str = "cpu"
    attn_implementation: str | None = None  # None = transformers' default (sdpa)
    trust_remote_code: bool = False  # off unless the user asks: model code is untrusted
    # positive control: one RMSNorm made batch-variant on purpose; None = on for the trained demo model
    # only (so its effect shows on any CPU, labelled as such), off for every other model
    inject_variance: bool | None = None


@dataclass
class LoadedModel:
    model: object  # transformers PreTrainedModel, eval mode
    tokenizer: object
    description: dict  # name, embedded_default, layers, hidden, vocab, params, dtype, device


def load_model(spec: ModelSpec) -> LoadedModel:
    if spec.dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, not {spec.dtype!r}")
    check_device(spec.device)
    source = _resolve_source(spec.name)
    model, tokenizer = _from_pretrained(source, spec)
    _ensure_pad_token(tokenizer)
    description = _describe(model, spec)
    if injects_variance(spec):
        description["injected_variance"] = inject(model)
    return LoadedModel(model, tokenizer, description)


def injects_variance(spec: ModelSpec) -> bool:
    """Whether the model gets the batch-variant norm: as asked, else only for the trained demo."""
    if spec.inject_variance is not None:
        return spec.inject_variance
    from nondet.probes.demo_model import demo_kind

    return spec.name is None and demo_kind() == "trained"


def inject(model) -> str:
    """The positive control (kernels/variant.py); the module's name goes into the fingerprint."""
    from nondet.kernels.variant import inject_batch_variance

    try:
        return inject_batch_variance(model)
    except ValueError as exc:
        raise UsageError(f"--inject-variance: {exc}") from None


def check_device(device: str) -> None:
    """A one-line UsageError for a device string torch does not know or cannot use here."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if parsed.type == "cpu":
        return
    backend = getattr(torch, parsed.type, None)
    if backend is None or not hasattr(backend, "is_available"):
        raise UsageError(f"--device {device!r}: nondet runs on cpu or cuda, not {parsed.type}")
    if parsed.type == "cuda" and not torch.backends.cuda.is_built():
        raise UsageError(f"--device {device!r}: this torch ({torch.__version__}) was built without CUDA; "
                         "use --device cpu")
    if not backend.is_available():
        raise UsageError(f"--device {device!r}: no {parsed.type} device is visible; use --device cpu")
    count = backend.device_count() if hasattr(backend, "device_count") else 1
    if parsed.index is not None and parsed.index >= count:
        raise UsageError(f"--device {device!r}: only {count} {parsed.type} device(s) visible "
                         f"({parsed.type}:0..{parsed.type}:{count - 1})")


def _resolve_source(name: str | None) -> str:
    if name is None:
        from nondet.probes.demo_model import resolve_demo_dir

        return str(resolve_demo_dir())
    looks_local = name.startswith((".", "/", "~")) or Path(name).expanduser().exists()
    if looks_local and not Path(name).expanduser().is_dir():
        raise ModelLoadError(f"model directory not found: {name}")
    return str(Path(name).expanduser()) if looks_local else name


def _from_pretrained(source: str, spec: ModelSpec):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"dtype": getattr(torch, spec.dtype), "trust_remote_code": spec.trust_remote_code}
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    from transformers.utils import logging as hf_logging

    bars_were_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # our own progress bar is the only one on screen
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
        model = model.to(spec.device).eval()
    except (OSError, ValueError, KeyError, RuntimeError, ImportError, MemoryError) as exc:
        if is_out_of_memory(exc):  # torch.OutOfMemoryError on a GPU, a plain RuntimeError on CPU
            raise OutOfMemoryError(f"out of memory loading {source} on {spec.device}") from exc
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"cannot load model {source!r}: {first[:300]}") from exc
    finally:
        if bars_were_enabled:
            hf_logging.enable_progress_bar()
    return model, tokenizer


def _ensure_pad_token(tokenizer) -> None:
    # Left padding keeps every prompt's last token in the last column (needed for ragged).
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token


def _describe(model, spec: ModelSpec) -> dict:
    cfg = model.config
    demo = None
    if spec.name is None:
        from nondet.probes.demo_model import DEMO_NAME, demo_kind

        demo = demo_kind()
    return {
        "name": spec.name or (DEMO_NAME if demo == "trained" else "nondet-default"),
        "embedded_default": spec.name is None,
        "demo": demo,  # "trained" (SmolLM2) | "random" | None (a user's model)
        "architecture": type(model).__name__,
        "layers": getattr(cfg, "num_hidden_layers", None),
        "hidden": getattr(cfg, "hidden_size", None),
        "vocab": getattr(cfg, "vocab_size", None),
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": spec.dtype,
        "device": spec.device,
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
    }
