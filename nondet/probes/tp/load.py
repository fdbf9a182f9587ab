"""A worker's model: the static probe's loading, with transformers' tp_plan="auto" at degree > 1.

transformers shards every module its plan names (Qwen3: q/k/v and gate/up column-wise,
o_proj and down_proj row-wise, each followed by an all-reduce) over the process group this
worker already joined; the rest (embeddings, norms, lm_head as the model's plan says) is
replicated. Degree 1 loads as the static probe does (probes/models/loading.py), so TP1 is the
baseline; the few steps here mirror that module's (source, pad token, description) because
from_pretrained needs tp_plan passed in.
"""

from pathlib import Path

from nondet.errors import ModelLoadError, OutOfMemoryError, is_out_of_memory
from nondet.probes.core.child_process import one_line
from nondet.probes.models.load_checks import check_weights_loaded, load_errors
from nondet.probes.models.loading import (LoadedModel, ModelSpec, ensure_pad_token, inject, injects_variance,
                                          model_notes)
from nondet.probes.models.quiet import quiet_loading


def load_tp_model(spec: ModelSpec, degree: int, device: str) -> LoadedModel:
    """The model on this rank's device (sharded when degree > 1), eval mode, and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    source = model_source(spec.name)
    kwargs = {"dtype": getattr(torch, spec.dtype), "trust_remote_code": spec.trust_remote_code}
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    if degree > 1:
        kwargs.update(tp_kwargs(degree))
    try:
        with quiet_loading():
            tokenizer = load_tokenizer(source, spec)
            model, info = AutoModelForCausalLM.from_pretrained(source, output_loading_info=True, **kwargs)
        check_weights_loaded(source, model, info)
        ensure_pad_token(tokenizer, model)
        model = (model if degree > 1 else model.to(device)).eval()
    except load_errors() as exc:
        if is_out_of_memory(exc):
            raise OutOfMemoryError(f"out of memory loading {source} at --tp {degree} on {device}") from exc
        raise ModelLoadError(f"cannot load model {source!r} at --tp {degree}: {one_line(exc, 300)}") from exc
    description = {**_describe(model, spec, device, degree), **model_notes(model, source, spec)}
    if injects_variance(spec):
        description["injected_variance"] = inject(model)
    return LoadedModel(model, tokenizer, description)


def tp_kwargs(degree: int) -> dict:
    """from_pretrained's tensor-parallel arguments. The degree must be given: transformers 5.2x's
    DistributedConfig defaults tp_size to 1, which loads every weight whole on every rank (no
    sharding, no all-reduce: a "TP2" run that is TP1 twice). Older releases take tp_plan/tp_size."""
    try:
        from transformers import DistributedConfig
    except ImportError:
        return {"tp_plan": "auto", "tp_size": degree}
    return {"distributed_config": DistributedConfig(tp_plan="auto", tp_size=degree)}


def model_source(name: str | None) -> str:
    """The directory or hub id from_pretrained reads: the embedded default (built on first use) for None."""
    if name is None:
        from nondet.probes.models.default_model import default_model_dir

        return str(default_model_dir())
    path = Path(name).expanduser()
    if name.startswith((".", "/", "~")) and not path.is_dir():
        raise ModelLoadError(f"model directory not found: {name}")
    return str(path) if path.exists() else name


def load_tokenizer(source: str, spec: ModelSpec):
    """The tokenizer, left-padded with a pad token (as the static probe's)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
    ensure_pad_token(tokenizer)
    return tokenizer


def _describe(model, spec: ModelSpec, device: str, degree: int) -> dict:
    cfg = model.config
    return {"name": spec.name or "nondet-default", "embedded_default": spec.name is None,
            "architecture": type(model).__name__, "layers": getattr(cfg, "num_hidden_layers", None),
            "hidden": getattr(cfg, "hidden_size", None), "vocab": getattr(cfg, "vocab_size", None),
            "params_per_rank": sum(p.numel() for p in model.parameters()), "dtype": spec.dtype, "device": device,
            "attn_implementation": getattr(cfg, "_attn_implementation", None), "tp_degree": degree,
            "tp_plan": "auto" if degree > 1 else None}
