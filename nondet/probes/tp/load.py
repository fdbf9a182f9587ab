"""A worker's model: the static probe's loading, with transformers' tp_plan="auto" at degree > 1.

transformers shards every module its plan names (Qwen3: q/k/v and gate/up column-wise,
o_proj and down_proj row-wise, each followed by an all-reduce) over the process group this
worker already joined; the rest (embeddings, norms, lm_head as the model's plan says) is
replicated. Degree 1 loads exactly as the static probe does, so TP1 is the baseline.
"""

from nondet.errors import ModelLoadError, OutOfMemoryError, is_out_of_memory
from nondet.probes import loading


def load_tp_model(spec: loading.ModelSpec, degree: int, device: str) -> loading.LoadedModel:
    """The model on this rank's device (sharded when degree > 1), eval mode, and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = loading._resolve_source(spec.name)
    kwargs = {"dtype": getattr(torch, spec.dtype), "trust_remote_code": spec.trust_remote_code}
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    if degree > 1:
        kwargs["tp_plan"] = "auto"
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
        model = (model if degree > 1 else model.to(device)).eval()
    except (OSError, ValueError, KeyError, RuntimeError, ImportError, MemoryError) as exc:
        if is_out_of_memory(exc):
            raise OutOfMemoryError(f"out of memory loading {source} at --tp {degree} on {device}") from exc
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"cannot load model {source!r} at --tp {degree}: {first[:300]}") from exc
    loading._ensure_pad_token(tokenizer)
    description = {**loading._describe(model, spec), "device": device, "tp_degree": degree,
                   "tp_plan": "auto" if degree > 1 else None}
    if spec.inject_variance:
        description["injected_variance"] = loading._inject(model)
    return loading.LoadedModel(model, tokenizer, description)
