"""The embedded default model: a random-weight Qwen3 and a BPE tokenizer, built in code.

Nothing is downloaded. The model is a demonstration model: its weights are random (fixed
seed), so its text is gibberish, but its kernels are the real ones, so its batch variance
is real. It is materialised once with save_pretrained into a cache directory and then
loaded through the same from_pretrained path as any user model.
"""

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from nondet.probes.core.cache_dir import cache_root  # noqa: F401 (re-exported: demo_model, drafts, scripts)
from nondet.probes.core.corpus import FILLERS, TRAINING_TEXT

DEFAULT_MODEL_NAME = "nondet-default"


@dataclass(frozen=True)
class DefaultModelSpec:
    vocab_size: int = 2048  # BPE vocabulary trained on the built-in corpus
    hidden_size: int = 512  # big enough for MKL to pick batch-dependent gemm paths
    intermediate_size: int = 1536
    num_hidden_layers: int = 4  # small enough that a probe on 2 cores takes seconds
    num_attention_heads: int = 8
    num_key_value_heads: int = 4  # GQA, like real Qwen3 models
    head_dim: int = 64
    max_position_embeddings: int = 4096
    seed: int = 0  # weights come from torch.manual_seed(seed)
    dtype: str = "bfloat16"
    version: int = 1  # bump when the construction changes

    def digest(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def default_model_dir(spec: DefaultModelSpec = DefaultModelSpec()) -> Path:
    """Build the default model on first use and return its directory."""
    target = cache_root() / f"default-model-{spec.digest()}"
    if (target / "nondet-default.json").exists():
        return target
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    build_default_model(spec, tmp)
    tmp.rename(target) if not target.exists() else None
    return target


def build_default_model(spec: DefaultModelSpec, out_dir: Path) -> None:
    """Write tokenizer + random Qwen3 weights with save_pretrained into out_dir."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_size)
    tokenizer.save_pretrained(out_dir)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(config)
    from nondet.probes.models.quiet import quiet_loading

    with quiet_loading():  # built once per cache; a failed command's error line stays its only line
        model.to(getattr(torch, spec.dtype)).save_pretrained(out_dir)
    (out_dir / "nondet-default.json").write_text(json.dumps(asdict(spec), indent=1))


def build_tokenizer(vocab_size: int):
    """A byte-level BPE trained on the built-in corpus (deterministic: single pass, no shuffle)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|bos|>", "<|eos|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(FILLERS + TRAINING_TEXT) * 2, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token="<|pad|>", bos_token="<|bos|>", eos_token="<|eos|>",
        padding_side="left",
    )
