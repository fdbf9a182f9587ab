"""A model load that failed or left the model partial, told in one line.

load_errors: what a failed load raises (the builtin kinds and the libraries' own); load_failure: its one
line (a broken weights file, the files a directory lacks, an attention config.json stores and this host
cannot run, a model with its own code); check_weights_loaded: a checkpoint that does not fit the model its
config.json builds (parameters left random: refused; tensors left unused: a warning).
"""

import warnings
from pathlib import Path

from nondet.errors import ModelLoadError, UnusedWeightsWarning


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


def load_failure(source: str, exc: Exception) -> str:
    """One line: the broken weights file where one is found, the files a local directory lacks, else the
    library's message joined onto one line (transformers' messages run over several, and their first alone
    stops mid-sentence), shortened at a word."""
    text = one_line(exc)
    broken = next(filter(None, map(_safetensors_problem, sorted(Path(source).glob("*.safetensors")))), None)
    if broken:
        return f"cannot load model {source!r}: {broken} ({type(exc).__name__}: {shortened(text, 200)})"
    missing = _missing_files(Path(source)) if Path(source).is_dir() else []
    if missing:
        return (f"cannot load model {source!r}: it has no {' and no '.join(missing)}; pass the directory "
                "save_pretrained wrote (the model's and the tokenizer's)")
    if "has been toggled on, but it cannot be used" in text:  # config.json's _attn_implementation, absent here
        what, why = text.split(", but", 1)[0], text.split("error:", 1)[-1].strip().rstrip(".")
        return (f"cannot load model {source!r}: {shortened(what, 80)} (config.json's _attn_implementation), and "
                f"this host cannot run it ({shortened(why, 120)}); pass --attn-implementation sdpa")
    if "trust_remote_code=True" in text:  # transformers names its argument, not our flag
        return (f"cannot load model {source!r}: it runs its own Python code (auto_map in config.json); read it, "
                "then pass --trust-remote-code to run it")
    return f"cannot load model {source!r}: {shortened(text, 300)}"


def one_line(exc: Exception) -> str:
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def shortened(text: str, limit: int) -> str:
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
