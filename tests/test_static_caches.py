"""static_caches.py: the compiled path hands generate one held static cache per model and shape,
reset to the zeros a fresh cache starts from (so CUDA graphs are recorded once, and bits do not change)."""

import pytest
import torch

from nondet.probes.core.batch import Batch
from nondet.probes.core.replay import DecodeSettings, generate
from nondet.probes.core.static_caches import reusable_static_cache, static_cache

pytestmark = pytest.mark.skipif(not reusable_static_cache(), reason="transformers' static cache is too old")


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
            AutoTokenizer.from_pretrained(tiny_model_dir))


def test_one_cache_per_model_and_shape_reset_on_each_hand_out(model_and_tokenizer):
    model, _ = model_and_tokenizer
    with torch.inference_mode():
        first = static_cache(model, 1, 40)
        assert static_cache(model, 1, 40) is first
        other = static_cache(model, 2, 40)
        assert other is not first and static_cache(model, 2, 40) is other
        k, v = torch.ones(2, 2, 3, 16), torch.ones(2, 2, 3, 16)
        other.update(k, v, 0)
        assert other.get_seq_length() == 3
        again = static_cache(model, 2, 40)
        assert again is other and int(again.get_seq_length()) == 0
        assert all(layer.keys is None or not layer.keys.any() for layer in again.layers[:1])


def test_calls_on_the_held_cache_give_the_first_calls_logits(model_and_tokenizer):
    """Three compiled greedy calls, the later ones on the held (reset) cache: the same tokens and bits."""
    model, tokenizer = model_and_tokenizer
    batch = Batch(input_ids=[[5, 9, 13, 2]], attention_mask=[[1] * 4], target_rows=(0,))
    settings = DecodeSettings(max_new_tokens=6, temperature=0.0, seed=0, compile_backend="aot_eager")
    from nondet.probes.core.replay import Assist

    runs = [generate(model, tokenizer, batch, settings, None, assist=Assist()) for _ in range(3)]
    assert all(torch.equal(r.sequences, runs[0].sequences) for r in runs)
    assert all(torch.equal(torch.stack(r.logits), torch.stack(runs[0].logits)) for r in runs)
