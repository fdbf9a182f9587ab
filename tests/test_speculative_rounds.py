"""RoundLog counts one verification round per round on every transformers version pyproject.toml allows.

transformers 5.17's assisted decoding calls the stopping criteria twice a round (on the candidates,
then on the accepted tokens); 5.18 and later once. Read as rounds, 5.17's calls halved every round
(self:4 drafted 3 and accepted 3, then 0 and 0). An `assisted` RoundLog skips 5.17's first call.
In process, on the tiny Qwen3, under default kernels and the mode (whose sum of the candidates'
match mask must stay an integer: 5.17 subtracts it).
"""

import pytest

from nondet.probes.core.batch import Batch
from nondet.probes.core.replay import Assist, DecodeSettings, generate
from nondet.probes.speculative.source import RoundLog, drafting

K, TOKENS = 4, 12


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    from nondet.probes.models.loading import ModelSpec, load_model

    return load_model(ModelSpec(str(tiny_model_dir)))


def decode(loaded, assist: Assist, assisted: bool) -> tuple[list[int], RoundLog]:
    ids = [5, 17, 9, 33, 2]
    rounds = RoundLog(len(ids), assisted=assisted)
    batch = Batch(input_ids=[ids], attention_mask=[[1] * len(ids)], target_rows=(0,))
    with drafting(loaded.model, K), rounds.watching(loaded.model):
        out = generate(loaded.model, loaded.tokenizer, batch, DecodeSettings(TOKENS, 0.0, 0), None,
                       stopping=[rounds], assist=assist)
    return out.sequences[0, len(ids):].tolist(), rounds


@pytest.mark.parametrize("kernels", ["default", "batch-invariant"])
def test_self_drafting_rounds_draft_k_and_keep_them_all(target, kernels):
    from nondet.probes.core.kernels_mode import kernels_mode

    with kernels_mode(kernels, target.model):
        tokens, rounds = decode(target, Assist(assistant=target.model, drafted=K), assisted=True)
        plain, _ = decode(target, Assist(drafted=K), assisted=False)
    assert tokens == plain and len(tokens) == TOKENS
    assert rounds.drafted[:2] == [K, K] and rounds.produced[:2] == [K + 1, K + 1]  # every draft kept, + its own
    assert sum(rounds.produced) == TOKENS and rounds.rate() == 1.0


def test_a_plain_run_has_one_token_a_round(target):
    _, rounds = decode(target, Assist(drafted=K), assisted=False)
    assert rounds.produced == [1] * TOKENS and rounds.drafted == [0] * TOKENS
