"""transformers' KV-cache argument under its two names (past_key_values before 5.24, cache from it):
nondet passes the one the forward declares and reads the output field it has."""

import inspect

import torch

import family_models as fm
from nondet.kernels.hf_names import cache_kwarg, output_cache


def test_the_cache_goes_in_and_comes_back_by_the_installed_name(tmp_path):
    from transformers import DynamicCache

    model = fm.load(fm.save_family("qwen3", tmp_path), torch.float32)
    name = cache_kwarg(model)
    assert name in inspect.signature(model.forward).parameters
    cache = DynamicCache()
    ids = fm.prompts()[:1]
    with torch.no_grad():
        out = model(ids, use_cache=True, **{name: cache})
        assert output_cache(out) is cache and cache.get_seq_length() == ids.shape[1]
        step = model(ids[:, -1:], use_cache=True, **{name: output_cache(out)})  # the cache is read and grown
    assert cache.get_seq_length() == ids.shape[1] + 1 and step.logits.shape[1] == 1
