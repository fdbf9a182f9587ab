"""Random Qwen3 models saved with save_pretrained, for tests: the real from_pretrained path."""

import contextlib

# A chat template for the tiny test tokenizer (build_tokenizer has none): Qwen's ChatML layout (its
# markers tokenized as text here), which transformers serve parses a Qwen3 model's answer by;
# add_generation_prompt opens the assistant's turn.
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_qwen3(out, tokenizer, hidden: int, layers: int, heads: int, kv_heads: int, seed: int,
               intermediate: int | None = None):
    """tokenizer + a random bf16 Qwen3 (head_dim = hidden / heads) into `out`; returns `out`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer.save_pretrained(out)
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=hidden // heads, pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    return out


def save_qwen3_moe(out, hidden: int = 64, layers: int = 2, seed: int = 0):
    """tokenizer + a random fp32 Qwen3-MoE (8 experts, top-2, every layer sparse) into `out`; returns `out`."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from nondet.probes.models.default_model import build_tokenizer

    tokenizer = build_tokenizer(512)
    tokenizer.save_pretrained(out)
    cfg = Qwen3MoeConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         moe_intermediate_size=hidden // 2, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=hidden // 4, num_experts=8, num_experts_per_tok=2,
                         decoder_sparse_step=1, mlp_only_layers=[], pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg)
    for layer in model.model.layers:  # spread the routers: random init can leave their weights near zero
        torch.nn.init.normal_(layer.mlp.gate.weight, 0.0, 0.5)
    model.save_pretrained(out)
    return out


@contextlib.contextmanager
def cache_lengths(model):
    """Within: the length of the KV cache each forward of `model` is handed (get_max_length; None without one),
    appended to the list this yields."""
    lengths: list = []

    def seen(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        lengths.append(cache.get_max_length() if cache is not None else None)

    handle = model.register_forward_pre_hook(seen, with_kwargs=True)
    try:
        yield lengths
    finally:
        handle.remove()
