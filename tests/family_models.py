"""Tiny random models of every family the batch-invariant mode supports, of families it refuses, and
the comparisons the family matrix makes (tests/test_family_matrix.py on the CPU,
scripts/device/gpu_family_matrix.py on CUDA).

Each model is hidden 64, 2 layers, vocabulary 256, saved with save_pretrained and loaded back with
AutoModelForCausalLM.from_pretrained (the real loading path). Sliding windows are 8 tokens, shorter
than prompt + generated tokens, so a window that is ignored changes the logits. MoE families have
8 experts, top-2, so a batch spreads its tokens unevenly over the experts.

FAMILIES: the CPU matrix runs them in fp32 and bf16. MORE_FAMILIES: fp32 only on the CPU (in bf16 the
default kernels of an AVX-512 host gave row 0 the same bits alone and in a batch for every one of
them, so the default-kernel control cannot fire there); the GPU matrix runs both dtypes of all.
REFUSED among them: the mode refuses them, naming a module and an op.
"""

import contextlib

import torch

VOCAB, HIDDEN, LAYERS, WINDOW = 256, 64, 2, 8
PROMPT_LEN, STEPS, BATCH = 8, 12, 4  # 20 tokens: past the window of 8
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
        # the mode leaves its attention implementation at "sdpa" (Falcon does not take the interface), so
        # its attention calls F.scaled_dot_product_attention itself: sdpa.py routes that call
        "falcon": lambda: tf.FalconConfig(**_renamed(c, num_key_value_heads="num_kv_heads",
                                                     intermediate_size=None),
                                          new_decoder_architecture=True, parallel_attn=True, bias=False,
                                          alibi=False),
        # ALiBi scores through baddbmm, eager attention only
        "bloom": lambda: tf.BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS, n_head=4,
                                        pad_token_id=0, bos_token_id=1, eos_token_id=2),
        "gpt-j": lambda: tf.GPTJConfig(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=4, rotary_dim=8,
                                       n_positions=256, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
        "opt": lambda: tf.OPTConfig(**_renamed(c, intermediate_size="ffn_dim", num_key_value_heads=None),
                                    word_embed_proj_dim=HIDDEN),
        # phi-1 / phi-2: LayerNorm, half the head dims rotated, dense attention and MLP in parallel
        "phi": lambda: tf.PhiConfig(**c, partial_rotary_factor=0.5),
        "stablelm": lambda: tf.StableLmConfig(**c, partial_rotary_factor=0.25, use_qkv_bias=True),
        # multi-query attention (SantaCoder, StarCoder)
        "gpt-bigcode": lambda: tf.GPTBigCodeConfig(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=4,
                                                   n_positions=256, multi_query=True, bos_token_id=1,
                                                   eos_token_id=2),
        # a vision-language model (Gemma3ForConditionalGeneration, what AutoModelForCausalLM loads for it):
        # a text-only prompt takes its text path; the vision tower is built, never run
        "gemma3-vlm": lambda: tf.Gemma3Config(
            text_config=dict(**c, head_dim=16, sliding_window=WINDOW,
                             layer_types=["sliding_attention", "full_attention"]),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               image_size=28, patch_size=14), mm_tokens_per_image=4),
        # Mamba hybrid: layer 0 Mamba (causal conv1d + selective scan, torch reference path), layer 1
        # attention with MoE
        "jamba": lambda: tf.JambaConfig(**c, num_experts=8, num_experts_per_tok=2, attn_layer_period=2,
                                        attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                                        mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8),
        # hybrid: layer 0 gated delta-rule linear attention (conv1d, chunked cumsum and triangular solve,
        # torch reference path), layer 1 full attention; MoE with a shared expert in both
        "qwen3-next": lambda: tf.Qwen3NextConfig(**c, head_dim=16, **_MOE, shared_expert_intermediate_size=32,
                                                 decoder_sparse_step=1, mlp_only_layers=[], linear_num_value_heads=4,
                                                 linear_num_key_heads=2, linear_key_head_dim=16,
                                                 linear_value_head_dim=16, linear_conv_kernel_dim=4,
                                                 layer_types=["linear_attention", "full_attention"]),
    }


def _renamed(config: dict, **names) -> dict:
    """`config` with keys renamed (old=new) or dropped (old=None), for configs that spell them otherwise."""
    out = {k: v for k, v in config.items() if k not in names}
    out.update({new: config[old] for old, new in names.items() if new is not None})
    return out


FAMILIES = ("llama", "qwen2", "qwen3", "qwen3-moe", "mistral", "mixtral", "gemma2", "gemma3", "phi3", "gpt2",
            "gpt-neox", "olmo2", "gpt-oss", "deepseek-v3")
MORE_FAMILIES = ("falcon", "bloom", "gpt-j", "opt", "phi", "stablelm", "gpt-bigcode", "gemma3-vlm", "jamba",
                 "qwen3-next")
ALL_FAMILIES = FAMILIES + MORE_FAMILIES
# family -> (module, aten op) of the one line the mode refuses it with: the first op its census finds
# that no batch-invariant kernel computes (Qwen3-Next's linear attention also has cumsum,
# linalg_solve_triangular and a sum over a middle dim; Jamba's Mamba only the conv1d)
REFUSED = {"jamba": ("model.layers.0.mamba", "aten::convolution"),
           "qwen3-next": ("model.layers.0.linear_attn", "aten::convolution")}
SDPA_FAMILIES = ("falcon",)  # attention calls F.scaled_dot_product_attention directly, also under the mode


def save_family(name: str, directory, tokenizer=None) -> str:
    """A tiny random model of the family, saved in fp32 under `directory` (with `tokenizer`, whose
    vocabulary it then takes, for the CLI); returns the path."""
    from transformers import AutoModelForCausalLM

    config = _configs()[name]()
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
        text = config.get_text_config()  # the config itself, or a vision-language model's text part
        text.vocab_size = len(tokenizer)
        text.pad_token_id, text.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
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


def greedy_logits(model, ids: torch.Tensor, steps: int = STEPS) -> list[torch.Tensor]:
    """Row 0's logits at each of `steps` greedy steps (HF generate) -> list of (vocab,) tensors."""
    with torch.no_grad():
        out = model.generate(ids.to(model.device), attention_mask=torch.ones_like(ids).to(model.device),
                             max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return [step[0].float().cpu() for step in out.logits]


def generate_three(model, ids: torch.Tensor, **fields):
    """Three greedy tokens of HF generate with their logits, on the path `fields` pick (a compile config or
    a static cache without compile): the compiled-vs-eager tests' call."""
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                          return_dict_in_generate=True, output_logits=True, **fields)


def first_difference(alone: list[torch.Tensor], batched: list[torch.Tensor]) -> int | None:
    """The first step whose logits differ in any bit, or None."""
    for step, (a, b) in enumerate(zip(alone, batched)):
        if not torch.equal(a, b):
            return step
    return None if len(alone) == len(batched) else min(len(alone), len(batched))


def alone_and_batched(model, ids: torch.Tensor, scope, steps: int = STEPS) -> tuple[list, list]:
    """Row 0's greedy logits under `scope()`, alone and in the batch `ids`."""
    with scope():
        return greedy_logits(model, ids[:1], steps), greedy_logits(model, ids, steps)


def invariance(model, ids: torch.Tensor, scope, steps: int = STEPS) -> int | None:
    """Row 0 alone vs the same row in the batch, under `scope()`: the first differing step or None."""
    return first_difference(*alone_and_batched(model, ids, scope, steps))


def prefill_error(model, ids: torch.Tensor, scope) -> float:
    """Relative difference of the prefill logits under `scope()` vs the default kernels."""
    with torch.no_grad():
        ref = model(ids.to(model.device)).logits.double()
        with scope():
            ours = model(ids.to(model.device)).logits.double()
    return ((ours - ref).norm() / ref.norm()).item()


class Noisy(torch.nn.Module):
    """A module with noise in eval mode too, nothing the RL trainer can switch off (its refusal's control; the
    refusal names the class, Noisy)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        out = self.inner(x)
        return out + 1e-3 * torch.randn_like(out)


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
    """(parent module, attribute) of the model's final norm, for every family in ALL_FAMILIES."""
    base = model.base_model
    # OPT keeps its layers in .decoder, a vision-language model its text model in .language_model
    for owner in (base, getattr(base, "decoder", None), getattr(base, "language_model", None)):
        for attr in ("norm", "ln_f", "final_layer_norm", "final_layernorm"):
            if owner is not None and hasattr(owner, attr):
                return owner, attr
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
