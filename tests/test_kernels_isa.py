"""The mode on each CPU instruction set: tiny MoE models, row 0 alone vs the same row in a batch of 4.

aten's CPU kernels are compiled for several instruction sets and dispatch to the best the CPU has
(ATEN_CPU_CAPABILITY=default forces the scalar build, =avx2 the AVX2 one). Their elementwise loops
round a transcendental differently in the vector body and the scalar tail, by instruction set
(tests/test_elementwise_position.py), so an invariance that holds on one can fail on another. Two cases,
each of which the mode failed on AVX-512 and AVX2 before cpu.whole_vectors (and passed on default):

- deepseek-v3: the router's sigmoid over the (T, 8) logits is all scalar tail for one token and all
  vector body for four; 1 ulp moves row 0's top-k weights (first differing step 5 on AVX-512, 3 on AVX2);
- gpt-oss, intermediate size 24: the experts' gate takes a sigmoid over a contiguous (n, 24), n the
  expert's token count (from the prefill on AVX-512, step 2 on AVX2).

Each instruction set runs in its own process (the capability is read once, at torch's import): greedy
decode with a KV cache, default kernels first (the control: they must differ, else the case proves
nothing here and the test skips), then under the mode (it must not differ).

Run as a script, this file computes one instruction set's cases and prints them as JSON.
"""

import json
import os
import subprocess
import sys

import pytest

STEPS = 8  # greedy steps: the pre-fix mode's first differences were at steps 0 to 5
PROMPT_SEED = 16  # fm.prompts(PROMPT_SEED): four different 8-token prompts
CASES = ("deepseek-v3", "gpt-oss")


def _capabilities() -> list[str | None]:
    """None (the CPU's best), "default", and "avx2" when the CPU has it (x86 only)."""
    import torch

    caps = [None, "default"]
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        caps.append("avx2")
    return caps


CAPABILITIES = _capabilities()


@pytest.fixture(scope="module")
def cases():
    """One process per instruction set, all started at once (each spends most of its time importing torch
    and transformers and building the models) -> a function: capability -> that process's JSON."""
    started, found = {}, {}
    for capability in CAPABILITIES:
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        if capability is not None:
            env["ATEN_CPU_CAPABILITY"] = capability
        started[capability] = subprocess.Popen([sys.executable, __file__], env=env, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True)

    def result(capability):
        if capability not in found:
            out, err = started[capability].communicate(timeout=300)
            assert started[capability].returncode == 0, err[-3000:]
            found[capability] = json.loads(out.strip().splitlines()[-1])
        return found[capability]

    yield result
    for process in started.values():
        process.kill()
        process.wait()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: c or "native")
def test_row_is_invariant_on_each_instruction_set(capability, case, cases):
    found = cases(capability)
    if capability is not None:
        assert found["capability"] == capability.upper(), f"torch ran {found['capability']}, not {capability}"
    from controls import SKIP_PREFIX

    if found[case]["default"] is None:
        pytest.skip(f"{SKIP_PREFIX}the default kernels are invariant on {case} on {found['capability']}")
    assert found[case]["mode"] is None, (f"{case} on {found['capability']}: row 0 alone differs from row 0 in a "
                                         f"batch of 4 from decode step {found[case]['mode']} under the mode")


def _model(case: str):
    """fp32, seeded. deepseek-v3: hidden 128, 2 layers (layer 0 dense, layer 1 MoE: 8 routed experts
    top-2 and a shared expert), MLA attention, default init (router weights N(0, 0.02)). gpt-oss: the
    family matrix's (tests/family_models.py) with intermediate size 24, not a multiple of a vector step."""
    import torch
    import transformers as tf

    import family_models as fm

    if case == "deepseek-v3":
        config = tf.DeepseekV3Config(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16,
                                     qk_nope_head_dim=16, v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
                                     n_group=1, topk_group=1, n_shared_experts=1, first_k_dense_replace=1,
                                     intermediate_size=64, moe_intermediate_size=32, max_position_embeddings=256,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    else:
        config = fm._configs()[case]()
        config.intermediate_size = 24
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    if case == "gpt-oss":
        fm._spread_weights(model)  # as the family matrix does: router weights and sinks that matter
    return model


def _cases() -> dict:
    """This process's instruction set and, per case, the first step where row 0 alone and batched differ
    (None: never) with the default kernels and under the mode."""
    import contextlib

    import torch

    import family_models as fm
    from controls import mode

    torch.set_num_threads(1)
    ids = fm.prompts(PROMPT_SEED)
    found = {"capability": torch.backends.cpu.get_cpu_capability()}
    for case in CASES:
        model = _model(case)
        found[case] = {"default": fm.invariance(model, ids, contextlib.nullcontext, STEPS),
                       "mode": fm.invariance(model, ids, lambda: mode(model=model), STEPS)}
    return found


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    print(json.dumps(_cases()))
