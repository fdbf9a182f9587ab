"""The embedded draft: the embedded default model cut to its first layer(s), built in code.

`--speculative draft[:K]` needs a draft with the target's tokenizer and nothing downloaded:
the target's own first layer with its embeddings, final norm and head (early exit, as
LayerSkip drafts do). The weights are random, so the draft is a poor one (acceptance 4.5% at
K=4 over 60 tokens of the default prompt, CPU, 2026-11-23; 2 or 3 layers agree no better);
it exercises the draft-model path and its verification rounds, while `self:K` is the sharp
probe of the k+1 axis. Saved once with save_pretrained beside the default model.
"""

import json
import os
from pathlib import Path

from nondet.probes.models.default_model import DefaultModelSpec, cache_root, default_model_dir

DRAFT_LAYERS = 1  # decoder layers kept from the target (of DefaultModelSpec.num_hidden_layers)


def default_draft_dir(spec: DefaultModelSpec = DefaultModelSpec(), layers: int = DRAFT_LAYERS) -> Path:
    """Build the embedded draft on first use and return its directory."""
    target = cache_root() / f"default-draft-{spec.digest()}-l{layers}"
    if (target / "nondet-draft.json").exists():
        return target
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    build_draft(default_model_dir(spec), layers, tmp)
    tmp.rename(target) if not target.exists() else None
    return target


def build_draft(model_dir: Path, layers: int, out_dir: Path) -> None:
    """The model in model_dir with only its first `layers` decoder layers, and its tokenizer."""
    from nondet.probes.models.quiet import quiet_loading

    with quiet_loading():  # a one-off build; the probe's own bar is the only one on screen
        _build_draft(model_dir, layers, out_dir)


def _build_draft(model_dir: Path, layers: int, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    config = model.config
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    with torch.random.fork_rng(devices=[]):  # the throwaway init must not move the caller's RNG
        draft = type(model)(config).to(model.dtype)
    draft.load_state_dict(model.state_dict(), strict=False)  # keys of layers >= `layers` are dropped
    out_dir.mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out_dir)
    draft.save_pretrained(out_dir)
    (out_dir / "nondet-draft.json").write_text(json.dumps({"from": str(model_dir), "layers": layers}))
