"""The draft on the compiled path (probes/speculative/compiled_draft.py): StaticDraft proposes what transformers'
own assistant proposes, round by round, while its steps go through the draft's compiled forward.

The case: a tiny random Qwen3 target whose second layer is damped (its output projections scaled
by 0.4), and its first layer as the draft, so the draft agrees often but not always: rounds where
every draft is kept (a 2-row feed next round) and rounds cut short (a crop of the draft's cache).
On the CPU both paths compile with aot_eager; `NONDET_TEST_DEVICE=cuda` runs the same on a GPU with
Inductor and CUDA graphs (scripts/gpu.sh draft-tests).
"""

import os

import pytest
import torch

from nondet.probes.core.batch import Batch
from nondet.probes.speculative.compiled_draft import StaticDraft, _through_first_eos, static_drafts
from nondet.probes.core.replay import Assist, DecodeSettings, generate
from nondet.probes.speculative.source import RoundLog, drafting
from nondet.probes.core.static_caches import reusable_static_cache

pytestmark = pytest.mark.skipif(not reusable_static_cache(), reason="transformers' static cache cannot crop")

K = 3
DEVICE = os.environ.get("NONDET_TEST_DEVICE", "cpu")
BACKEND = "inductor" if DEVICE == "cuda" else "aot_eager"
PROMPTS = [[5, 17, 9, 33, 2, 71, 8], [40, 3, 3, 12]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target, draft, tokenizer): the damped 2-layer target and its first layer, fp32."""
    from model_fixtures import save_qwen3
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nondet.probes.speculative.default_draft import build_draft
    from nondet.probes.models.default_model import build_tokenizer

    root = tmp_path_factory.mktemp("draft-pair")
    save_qwen3(root / "t", build_tokenizer(256), hidden=64, layers=2, heads=4, kv_heads=2, seed=3)
    target = AutoModelForCausalLM.from_pretrained(root / "t", dtype=torch.float32).to(DEVICE)
    with torch.no_grad():
        target.model.layers[1].self_attn.o_proj.weight.mul_(0.4)
        target.model.layers[1].mlp.down_proj.weight.mul_(0.4)
    target.save_pretrained(root / "damped")
    AutoTokenizer.from_pretrained(root / "t").save_pretrained(root / "damped")
    build_draft(root / "damped", 1, root / "draft")
    draft = AutoModelForCausalLM.from_pretrained(root / "draft", dtype=torch.float32).to(DEVICE)
    return target, draft, AutoTokenizer.from_pretrained(root / "t")


def _assisted(target, draft, tokenizer, ids, static: bool):
    """Greedy assisted decoding of ids on the compiled path -> (tokens, drafted, produced)."""
    settings = DecodeSettings(max_new_tokens=24, temperature=0.0, seed=0, compile_backend=BACKEND)
    rounds = RoundLog(len(ids))
    batch = Batch(input_ids=[ids], attention_mask=[[1] * len(ids)], target_rows=(0,))
    with drafting(draft, K), (static_drafts(target, K) if static else _no_override()), rounds.watching(target):
        out = generate(target, tokenizer, batch, settings, None, stopping=[rounds],
                       assist=Assist(assistant=draft, drafted=K))
    return out.sequences[0, len(ids):].tolist(), rounds.drafted, rounds.produced


class _no_override:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# the second prompt (a repeated token) in the slow selection: each compiles the draft again (17 s, 2-core AVX2)
@pytest.mark.parametrize("ids", [PROMPTS[0], pytest.param(PROMPTS[1], marks=pytest.mark.slow)])
def test_static_draft_proposes_what_transformers_assistant_proposes(pair, ids):
    target, draft, tokenizer = pair
    calls = []
    real = StaticDraft.get_candidates

    def counting(self, input_ids, **kwargs):
        calls.append(input_ids.shape[-1])
        return real(self, input_ids, **kwargs)

    StaticDraft.get_candidates = counting
    try:
        ours = _assisted(target, draft, tokenizer, ids, static=True)
    finally:
        StaticDraft.get_candidates = real
    theirs = _assisted(target, draft, tokenizer, ids, static=False)
    assert calls, "StaticDraft was not used"
    assert ours == theirs  # tokens, drafted per round, produced per round
    kept = [p - 1 for p in ours[2]]
    assert K in kept and any(0 <= k < K for k in kept), kept  # both a full round and a cut one


def test_the_generator_is_an_instance_override_removed_after(pair):
    target, _, _ = pair
    assert "_get_candidate_generator" not in vars(target)
    with static_drafts(target, K):
        assert "_get_candidate_generator" in vars(target)
    assert "_get_candidate_generator" not in vars(target)


def test_drafts_end_after_the_first_end_of_sequence_token():
    assert _through_first_eos([4, 7, 2, 9], {2}) == [4, 7, 2]
    assert _through_first_eos([4, 7], {2}) == [4, 7]
