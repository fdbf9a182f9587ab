"""Random Qwen3 models saved with save_pretrained, for tests: the real from_pretrained path."""


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
