"""Shared fixtures. The default model is built into a per-session temp cache (never ~/.cache)."""

import os
import tempfile

import pytest

_CACHE = tempfile.mkdtemp(prefix="nondet-test-cache-")
os.environ.setdefault("NONDET_CACHE", _CACHE)


@pytest.fixture(scope="session")
def default_model_dir():
    from nondet.probes.default_model import default_model_dir as build

    return build()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen3 + tokenizer saved with save_pretrained: the real loading path."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from nondet.probes.default_model import build_tokenizer

    out = tmp_path_factory.mktemp("tiny-qwen3")
    tok = build_tokenizer(512)
    tok.save_pretrained(out)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(1)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    return out
