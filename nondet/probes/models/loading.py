"""Load a causal LM and its tokenizer: the embedded default, a local directory or a hub id.

Every path goes through from_pretrained, so the embedded default exercises the same code
as a user's model. Errors become one-line ModelLoadError / UsageError.
"""

import functools
import warnings
from dataclasses import dataclass
from pathlib import Path

from nondet.errors import ModelLoadError, OutOfMemoryError, UnusedWeightsWarning, UsageError, is_out_of_memory
from nondet.probes.core.generation_defaults import ignored_defaults

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
    _ensure_pad_token(tokenizer, model)
    description = _describe(model, spec)
    shipped = checkpoint_dtype(source)
    if shipped and shipped != spec.dtype:  # e.g. a float16 checkpoint probed in the default bfloat16
        description["checkpoint_dtype"] = shipped
    if ignored_defaults(model):  # its generation_config.json's settings, which the probe does not apply
        description["generation_defaults_ignored"] = ignored_defaults(model)
    if injects_variance(spec):
        description["injected_variance"] = inject(model)
    return LoadedModel(model, tokenizer, description)


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


def _resolve_source(name: str | None) -> str:
    if name is None:
        from nondet.probes.models.demo_model import resolve_demo_dir

        return str(resolve_demo_dir())
    looks_local = is_local_path(name)
    if looks_local and not Path(name).expanduser().is_dir():
        raise ModelLoadError(f"model directory not found: {name}")
    if looks_local and not (Path(name).expanduser() / "config.json").is_file():
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
            raise UsageError(f"--attn-implementation {spec.attn_implementation}: {_shortened(_one_line(exc), 240)}"
                             ) from exc
        raise ModelLoadError(_load_failure(source, exc)) from exc
    return model, tokenizer


def check_weights_loaded(source: str, model, info: dict) -> None:
    """Every parameter the architecture has must come from the checkpoint. transformers initialises the
    missing ones at random and goes on (a config.json whose model_type names another architecture than
    the weights': every layer random), so the probe would diagnose random numbers, not the model."""
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        model_type = getattr(getattr(model, "config", None), "model_type", "?")
        raise ModelLoadError(
            f"cannot load model {source!r}: {len(missing)} parameter(s) of {type(model).__name__} (model_type "
            f"{model_type!r} in config.json) are not in its weights (e.g. {missing[0]}), and would run on random "
            "values; check that config.json belongs to these weights")
    unused = sorted(info.get("unexpected_keys") or ())
    if unused:  # transformers drops them: a config.json of fewer layers runs a smaller model than the weights'
        warnings.warn(UnusedWeightsWarning(
            f"{source}: {len(unused)} tensor(s) of the weights are not used by {type(model).__name__} (e.g. "
            f"{unused[0]}); if config.json belongs to another size of this model, the probe runs a different one"),
            stacklevel=2)


def _config_with_attention(source: str, spec: ModelSpec):
    """The model's config with --attn-implementation set on it: a config.json that stores its own
    `_attn_implementation` (flash_attention_2, saved on a GPU) wins over from_pretrained's argument (transformers
    5.24), so the flag could not move a model off an attention this host lacks."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
    config._attn_implementation = spec.attn_implementation
    return config


_BUILTIN_LOAD_ERRORS = (OSError, ValueError, KeyError, RuntimeError, ImportError, MemoryError)


def load_errors() -> tuple[type, ...]:
    """What a failed model or tokenizer load raises: the builtin kinds, and the libraries' own that are none of
    them: safetensors' (a truncated or corrupt file), huggingface_hub's strict config validation (a config.json
    whose fields contradict each other, e.g. num_hidden_layers against layer_types)."""
    errors = list(_BUILTIN_LOAD_ERRORS)
    try:
        from safetensors import SafetensorError

        errors.append(SafetensorError)
    except ImportError:
        pass
    try:
        from huggingface_hub.errors import StrictDataclassError

        errors.append(StrictDataclassError)
    except ImportError:  # a huggingface_hub before strict dataclasses
        pass
    return tuple(errors)


def _load_failure(source: str, exc: Exception) -> str:
    """One line: the broken weights file where one is found, the files a local directory lacks, else the
    library's message joined onto one line (transformers' messages run over several, and their first alone
    stops mid-sentence), shortened at a word."""
    text = _one_line(exc)
    broken = next(filter(None, map(_safetensors_problem, sorted(Path(source).glob("*.safetensors")))), None)
    if broken:
        return f"cannot load model {source!r}: {broken} ({type(exc).__name__}: {_shortened(text, 200)})"
    missing = _missing_files(Path(source)) if Path(source).is_dir() else []
    if missing:
        return (f"cannot load model {source!r}: it has no {' and no '.join(missing)}; pass the directory "
                "save_pretrained wrote (the model's and the tokenizer's)")
    if "has been toggled on, but it cannot be used" in text:  # config.json's _attn_implementation, absent here
        what, why = text.split(", but", 1)[0], text.split("error:", 1)[-1].strip().rstrip(".")
        return (f"cannot load model {source!r}: {_shortened(what, 80)} (config.json's _attn_implementation), and "
                f"this host cannot run it ({_shortened(why, 120)}); pass --attn-implementation sdpa")
    if "trust_remote_code=True" in text:  # transformers names its argument, not our flag
        return (f"cannot load model {source!r}: it runs its own Python code (auto_map in config.json); read it, "
                "then pass --trust-remote-code to run it")
    return f"cannot load model {source!r}: {_shortened(text, 300)}"


def _one_line(exc: Exception) -> str:
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def _shortened(text: str, limit: int) -> str:
    """text, or its first words up to `limit` characters and an ellipsis (never a cut word)."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " …"


# what save_pretrained writes: weights in one of these forms, a tokenizer in one of these files
_WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "*.gguf")
_TOKENIZER = ("tokenizer.json", "*.model", "vocab.json", "*.tiktoken")


def _missing_files(directory: Path) -> list[str]:
    """What a model directory lacks of what from_pretrained reads: weights, a tokenizer."""
    missing = []
    if not any(next(directory.glob(pattern), None) for pattern in _WEIGHTS):
        missing.append("weights file (model.safetensors or pytorch_model.bin)")
    if not any(next(directory.glob(pattern), None) for pattern in _TOKENIZER):
        missing.append("tokenizer file (tokenizer.json, tokenizer.model or vocab.json)")
    return missing


def _safetensors_problem(path: Path) -> str | None:
    """'FILE is truncated: ...' (or corrupt) when a safetensors file is not what its header says, else None.
    Layout: 8 bytes little-endian header length N, N bytes of JSON header, then the tensors' bytes."""
    import json

    size = path.stat().st_size
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if size < 8 or 8 + n > size:
            return f"{path} is truncated: {size} bytes, shorter than its header"
        try:
            ends = [t["data_offsets"][1] for k, t in json.loads(f.read(n)).items() if k != "__metadata__"]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):  # not JSON, or not a tensor table
            return f"{path} is corrupt: its header is not a safetensors header"
    expected = 8 + n + max(ends, default=0)
    return f"{path} is truncated: {size} bytes of the {expected} its header lists" if size < expected else None


def check_prompts_fit(spec: ModelSpec, prompts, max_new_tokens: int, chat: bool = False,
                      system: str | None = None, ragged_batch: int = 0) -> None:
    """UsageError when a prompt, with the tokens to generate, is longer than the model's context
    (max_position_embeddings): positions past it were never trained, and a long prompt runs for
    minutes before anything fails. Reads the tokenizer and config only, before the weights load (the
    embedded demo's too: -n 9000 on it decoded past its context; its directory resolved without the
    random demo's note, which the load prints)."""
    from nondet.probes.core.batch import longest_ragged_row
    from nondet.probes.core.chat import model_texts, prompt_ids
    from nondet.probes.models.demo_model import resolve_demo_dir

    source = _resolve_source(spec.name) if spec.name is not None else str(resolve_demo_dir(note=False))
    tokenizer, context = _tokenizer_and_context(source, spec.trust_remote_code)
    if context is None:
        return
    for k, text in enumerate(model_texts(tokenizer, prompts, chat, system)):
        n = len(prompt_ids(tokenizer, text))
        which = "the prompt" if len(prompts) == 1 else f"prompt p{k}"
        if n + max_new_tokens > context:
            raise UsageError(_too_long(which, n, max_new_tokens, context))
        longest = longest_ragged_row(n, ragged_batch) if ragged_batch else n
        if longest + max_new_tokens > context:  # --ragged: filler rows up to 2x the prompt share its batch
            raise UsageError(f"with --ragged, a filler row beside {which} ({n} tokens) is {longest} tokens at batch "
                             f"size {ragged_batch}; with --max-new-tokens {max_new_tokens} it reaches "
                             f"{longest + max_new_tokens}, longer than the model's context of {context} tokens; "
                             "drop --ragged, or shorten the prompt or -n")


def _too_long(which: str, n: int, new: int, context: int) -> str:
    limit = f"the model's context of {context} tokens (max_position_embeddings)"
    if n > context:
        return f"{which} is {n} tokens, longer than {limit}; shorten it"
    return (f"{which} is {n} tokens; with --max-new-tokens {new} a request reaches {n + new} tokens, longer than "
            f"{limit}; shorten the prompt or lower --max-new-tokens")


@functools.lru_cache(maxsize=4)  # the gate checks each prompt's probe against the same model
def _tokenizer_and_context(source: str, trust_remote_code: bool):
    """(tokenizer, the model's context length or None) from the model directory or hub id."""
    from transformers import AutoConfig, AutoTokenizer

    from nondet.probes.models.quiet import quiet_loading

    try:
        with quiet_loading():
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
            config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except load_errors() as exc:
        raise ModelLoadError(_load_failure(source, exc)) from exc
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return tokenizer, getattr(text_config, "max_position_embeddings", None)


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


def _ensure_pad_token(tokenizer, model=None) -> None:
    # Left padding keeps every prompt's last token in the last column (needed for ragged).
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
