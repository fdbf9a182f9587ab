"""Load a causal LM and its tokenizer: the embedded default, a local directory or a hub id.

Every path goes through from_pretrained, so the embedded default exercises the same code
as a user's model. Errors become one-line ModelLoadError / UsageError.
"""

from dataclasses import dataclass
from pathlib import Path

from nondet.errors import ModelLoadError, OutOfMemoryError, UsageError, is_out_of_memory
from nondet.probes.core.generation_defaults import ignored_defaults
from nondet.probes.models.load_checks import check_weights_loaded, load_errors, load_failure, one_line, shortened

DTYPES = ("bfloat16", "float16", "float32")
MODEL_CONFIG = "config.json"  # a model directory's Hugging Face config (not the run directory's)


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
    source = resolve_source(spec.name)
    model, tokenizer = _from_pretrained(source, spec)
    ensure_pad_token(tokenizer, model)
    description = {**_describe(model, spec), **model_notes(model, source, spec)}
    if injects_variance(spec):
        description["injected_variance"] = inject(model)
    return LoadedModel(model, tokenizer, description)


def model_notes(model, source: str, spec: ModelSpec) -> dict:
    """The description's notes on how the probe runs the model it loaded (every loader's): the checkpoint's own
    dtype where the probe runs another, and its generation_config.json settings the probe does not apply."""
    notes = {}
    shipped = checkpoint_dtype(source)
    if shipped and shipped != spec.dtype:  # e.g. a float16 checkpoint probed in the default bfloat16
        notes["checkpoint_dtype"] = shipped
    ignored = ignored_defaults(model)
    if ignored:
        notes["generation_defaults_ignored"] = ignored
    return notes


def injects_variance(spec: ModelSpec) -> bool:
    """Whether the model gets the batch-variant norm: as asked, else only for the trained demo."""
    if spec.inject_variance is not None:
        return spec.inject_variance
    from nondet.probes.models.demo_model import demo_kind

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


def is_local_path(name: str) -> bool:
    """A local directory, not a hub id: a path written as one (./, /, ~) or one that exists."""
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()


def resolve_source(name: str | None) -> str:
    if name is None:
        from nondet.probes.models.demo_model import resolve_demo_dir

        return str(resolve_demo_dir())
    looks_local = is_local_path(name)
    if looks_local and not Path(name).expanduser().is_dir():
        raise ModelLoadError(f"model directory not found: {name}")
    if looks_local and not (Path(name).expanduser() / MODEL_CONFIG).is_file():
        raise ModelLoadError(f"model directory {name} holds no model (no config.json); pass the directory "
                             "save_pretrained wrote: config.json, the weights and the tokenizer")
    return str(Path(name).expanduser()) if looks_local else name


def _from_pretrained(source: str, spec: ModelSpec):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"dtype": getattr(torch, spec.dtype), "trust_remote_code": spec.trust_remote_code}
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    from nondet.probes.models.quiet import quiet_loading

    try:
        with quiet_loading():
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
            if spec.attn_implementation:
                kwargs["config"] = _config_with_attention(source, spec)
            model, info = AutoModelForCausalLM.from_pretrained(source, output_loading_info=True, **kwargs)
        check_weights_loaded(source, model, info)
        model = model.to(spec.device).eval()
    except load_errors() as exc:
        if is_out_of_memory(exc):  # torch.OutOfMemoryError on a GPU, a plain RuntimeError on CPU
            raise OutOfMemoryError(f"out of memory loading {source} on {spec.device}") from exc
        if spec.attn_implementation and "attn_implementation" in str(exc):  # the flag's value, not the model
            raise UsageError(f"--attn-implementation {spec.attn_implementation}: {shortened(one_line(exc), 240)}"
                             ) from exc
        raise ModelLoadError(load_failure(source, exc)) from exc
    return model, tokenizer


def _config_with_attention(source: str, spec: ModelSpec):
    """The model's config with --attn-implementation set on it: a config.json that stores its own
    `_attn_implementation` (flash_attention_2, saved on a GPU) wins over from_pretrained's argument (transformers
    5.24), so the flag could not move a model off an attention this host lacks."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
    config._attn_implementation = spec.attn_implementation
    return config


def checkpoint_dtype(source: str) -> str | None:
    """The dtype config.json says the weights were saved in ("float16", ...), before a load casts them; None
    where it says none or cannot be read."""
    from transformers import PretrainedConfig

    try:
        config, _ = PretrainedConfig.get_config_dict(source)
    except Exception:  # noqa: BLE001 - a note only: the load itself reports what is wrong
        return None
    dtype = config.get("dtype") or config.get("torch_dtype")
    return str(dtype).removeprefix("torch.") if isinstance(dtype, str) else None


def ensure_pad_token(tokenizer, model=None) -> None:
    """Left padding, a pad token (the EOS, else unk, where the tokenizer has none), inside the model's embedding
    table where the model is given. Left padding keeps every prompt's last token in the last column (ragged)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    pad_inside_vocabulary(tokenizer, model)


def pad_inside_vocabulary(tokenizer, model) -> None:
    """A [PAD] added to the tokenizer without resizing the embeddings (some Llama-2 fine-tunes) has an id past
    the embedding table: a padded batch raised IndexError. Pad positions are masked, so any id inside does: the
    EOS where it is inside, else 0."""
    rows = _embedding_rows(model)
    pad = tokenizer.pad_token_id
    if rows is None or pad is None or 0 <= pad < rows:
        return
    eos = tokenizer.eos_token_id
    tokenizer.pad_token_id = eos if eos is not None and 0 <= eos < rows else 0


def _embedding_rows(model) -> int | None:
    embeddings = getattr(model, "get_input_embeddings", lambda: None)() if model is not None else None
    return getattr(embeddings, "num_embeddings", None)


def _describe(model, spec: ModelSpec) -> dict:
    cfg = model.config
    demo = None
    if spec.name is None:
        from nondet.probes.models.demo_model import DEMO_NAME, demo_kind

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
