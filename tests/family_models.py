"""Tiny random models of every family the batch-invariant mode supports, and the comparisons the
family matrix makes (tests/test_family_matrix.py on the CPU, scripts/gpu_family_matrix.py on CUDA).

Each model is hidden 64, 2 layers, vocabulary 256, saved with save_pretrained and loaded back with
AutoModelForCausalLM.from_pretrained (the real loading path). Sliding windows are 8 tokens, shorter
than prompt + generated tokens, so a window that is ignored changes the logits. MoE families have
8 experts, top-2, so a batch spreads its tokens unevenly over the experts.
"""

import contextlib

import torch

VOCAB, HIDDEN, LAYERS, WINDOW = 256, 64, 2, 8
PROMPT_LEN, STEPS, BATCH = 8, 24, 4
_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256, pad_token_id=0,
               bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)


def _configs() -> dict:
    import transformers as tf

    c = _COMMON
    return {
        "llama": lambda: tf.LlamaConfig(**c),
        "qwen2": lambda: tf.Qwen2Config(**c),
        "qwen3": lambda: tf.Qwen3Config(**c, head_dim=16),
        "qwen3-moe": lambda: tf.Qwen3MoeConfig(**c, head_dim=16, **_MOE, decoder_sparse_step=1, mlp_only_layers=[]),
        "mistral": lambda: tf.MistralConfig(**c, sliding_window=WINDOW),
        "mixtral": lambda: tf.MixtralConfig(**c, num_local_experts=8, num_experts_per_tok=2),
        "gemma2": lambda: tf.Gemma2Config(**c, head_dim=16, sliding_window=WINDOW, attn_logit_softcapping=20.0,
                                          final_logit_softcapping=10.0),
        "gemma3": lambda: tf.Gemma3TextConfig(**c, head_dim=16, sliding_window=WINDOW,
                                              layer_types=["sliding_attention", "full_attention"]),
        "phi3": lambda: tf.Phi3Config(**c),
        "gpt2": lambda: tf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=4, n_positions=256,
                                      bos_token_id=1, eos_token_id=2),
        "gpt-neox": lambda: tf.GPTNeoXConfig(**{k: v for k, v in c.items() if k != "num_key_value_heads"}),
        "olmo2": lambda: tf.Olmo2Config(**c),
        "gpt-oss": lambda: tf.GptOssConfig(**c, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                                           sliding_window=WINDOW, layer_types=["sliding_attention",
                                                                               "full_attention"]),
        # MLA: every head has its own latent-projected K and V, so KV heads = heads
        "deepseek-v3": lambda: tf.DeepseekV3Config(**{**c, "num_key_value_heads": 4}, moe_intermediate_size=32, n_routed_experts=8,
                                                   num_experts_per_tok=2, n_group=2, topk_group=1,
                                                   n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32,
                                                   kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                                                   v_head_dim=8),
    }


FAMILIES = ("llama", "qwen2", "qwen3", "qwen3-moe", "mistral", "mixtral", "gemma2", "gemma3", "phi3", "gpt2",
            "gpt-neox", "olmo2", "gpt-oss", "deepseek-v3")


def save_family(name: str, directory, tokenizer=None) -> str:
    """A tiny random model of the family, saved in fp32 under `directory` (with `tokenizer`, whose
    vocabulary it then takes, for the CLI); returns the path."""
    from transformers import AutoModelForCausalLM

    config = _configs()[name]()
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
        config.vocab_size = len(tokenizer)
        config.pad_token_id, config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    _spread_weights(model)
    model.save_pretrained(directory)
    return str(directory)


def _spread_weights(model) -> None:
    """Random init gives some families zero router weights or tiny sinks (every expert tied): spread them,
    so routing and sinks are exercised for real."""
    for name, param in model.named_parameters():
        if name.endswith(("router.weight", "gate.weight", "sinks")) and param.dim() <= 2:
            with torch.no_grad():
                param.normal_(0.0, 0.5)


def load(directory, dtype: torch.dtype, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(device).eval()


def prompts(seed: int = 1) -> torch.Tensor:
    """(BATCH, PROMPT_LEN) token ids, every row different, no padding."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (BATCH, PROMPT_LEN), generator=g)


def greedy_logits(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Row 0's logits at each of STEPS greedy steps (HF generate) -> list of (vocab,) tensors."""
    with torch.no_grad():
        out = model.generate(ids.to(model.device), attention_mask=torch.ones_like(ids).to(model.device),
                             max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return [step[0].float().cpu() for step in out.logits]


def first_difference(alone: list[torch.Tensor], batched: list[torch.Tensor]) -> int | None:
    """The first step whose logits differ in any bit, or None."""
    for step, (a, b) in enumerate(zip(alone, batched)):
        if not torch.equal(a, b):
            return step
    return None if len(alone) == len(batched) else min(len(alone), len(batched))


def invariance(model, ids: torch.Tensor, scope) -> int | None:
    """Row 0 alone vs the same row in the batch, under `scope()`: the first differing step or None."""
    with scope():
        alone = greedy_logits(model, ids[:1])
        batched = greedy_logits(model, ids)
    return first_difference(alone, batched)


def prefill_error(model, ids: torch.Tensor, scope) -> float:
    """Relative difference of the prefill logits under `scope()` vs the default kernels."""
    with torch.no_grad():
        ref = model(ids.to(model.device)).logits.double()
        with scope():
            ours = model(ids.to(model.device)).logits.double()
    return ((ours - ref).norm() / ref.norm()).item()


class BatchVariantNorm(torch.nn.Module):
    """The positive control: wraps the model's final norm; with more than one row in the call its
    output is rescaled by a sum of squares taken as 8 bf16 partial sums (the split strategy a
    batch-dependent kernel picks), alone by an exact fp32 one: so row 0's bits depend on the batch."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        y = self.norm(x)
        if x.numel() // x.shape[-1] == 1:
            return y
        exact = x.float().pow(2).sum(-1, keepdim=True)
        split = sum(c.to(torch.bfloat16).pow(2).sum(-1, keepdim=True) for c in x.float().chunk(8, dim=-1))
        return y * (split.float() / exact).to(y.dtype)


def final_norm_owner(model) -> tuple[object, str]:
    """(parent module, attribute) of the model's final norm, for every family in FAMILIES."""
    base = model.base_model
    for attr in ("norm", "ln_f", "final_layer_norm"):
        if hasattr(base, attr):
            return base, attr
    raise ValueError(f"no final norm found on {type(model).__name__}")


@contextlib.contextmanager
def batch_variance(model):
    """The final norm made batch-variant for the body (restored after)."""
    owner, attr = final_norm_owner(model)
    original = getattr(owner, attr)
    setattr(owner, attr, BatchVariantNorm(original))
    try:
        yield
    finally:
        setattr(owner, attr, original)
