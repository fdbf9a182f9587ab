"""The positive control (kernels/variant.py) on every family with a post-attention RMSNorm.

A lone row gets the model's own norm, bit for bit, whatever its formula (Gemma's 1 + weight was
once replaced by Llama's weight, which zeroed a randomly initialised Gemma layer's attention
output); several rows sharing the call get the split sum of squares (positive control), and under
the mode's norm class they get the lone row's bits again (negative control).
"""

import pytest
import torch

from family_models import FAMILIES, save_family
from nondet.kernels import batch_invariant
from nondet.kernels.variant import _plain_formula_is_the_originals, inject_batch_variance

NO_DECODER_LAYERS = {"gpt2", "gpt-neox"}  # no model.layers: the control refuses them (tested below)
# the rescaled path: Gemma's 1 + weight in fp32; OLMo 2 and gpt-oss multiply the weight before the cast
FORMULA_OF_ITS_OWN = {"gemma2", "gemma3", "olmo2", "gpt-oss"}


@pytest.fixture(scope="module", params=[f for f in FAMILIES if f not in NO_DECODER_LAYERS])
def norms(request, tmp_path_factory):
    """(family, the original post-attention norm of layer 1, its batch-variant replacement), bf16,
    the norm's weight made random so a formula that ignores it, or adds 1 to it, shows."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(save_family(request.param, tmp_path_factory.mktemp("fam")),
                                                 dtype=torch.bfloat16)
    original = model.model.layers[1].post_attention_layernorm
    with torch.no_grad():
        original.weight.copy_(torch.randn(original.weight.shape, generator=torch.Generator().manual_seed(1)))
    inject_batch_variance(model)
    return request.param, original, model.model.layers[1].post_attention_layernorm


def _rows(n: int, hidden: int):
    return torch.randn(n, 1, hidden, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16) * 3


def test_a_lone_row_gets_the_models_own_norm(norms):
    family, original, variant = norms
    with torch.no_grad():
        for row in _rows(8, original.weight.shape[-1]):
            assert torch.equal(variant(row[None]), original(row[None])), family


def test_rows_sharing_a_call_get_other_bits_and_the_mode_gives_them_back(norms):
    family, original, variant = norms
    x = _rows(8, original.weight.shape[-1])
    with torch.no_grad():
        alone = torch.cat([original(row[None]) for row in x])
        shared = variant(x)
        assert not torch.equal(shared, alone), family  # positive control: the split sum shows
        assert (shared.float() - alone.float()).abs().max() < 0.1 * alone.float().abs().max()  # still the norm
        with batch_invariant(ops={"norm"}):
            assert torch.equal(variant(x), torch.cat([variant(row[None]) for row in x])), family


def test_the_plain_formula_is_used_only_where_it_is_the_originals(norms):
    family, original, _ = norms
    eps = getattr(original, "variance_epsilon", None) or getattr(original, "eps")
    assert _plain_formula_is_the_originals(original, eps) == (family not in FORMULA_OF_ITS_OWN)


def test_the_replacement_is_one_module_at_the_norms_name(norms):
    _, original, variant = norms
    assert [name for name, _ in variant.named_modules()] == [""]
    assert variant.weight is original.weight


@pytest.mark.parametrize("family", sorted(NO_DECODER_LAYERS))
def test_a_model_without_decoder_layers_is_refused(family, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(save_family(family, tmp_path))
    with pytest.raises(ValueError, match="no model.layers"):
        inject_batch_variance(model)


def test_a_norm_without_a_weight_is_refused(tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(save_family("llama", tmp_path))
    model.model.layers[1].post_attention_layernorm = torch.nn.Identity()
    with pytest.raises(ValueError, match="post_attention_layernorm has no weight"):
        inject_batch_variance(model)


def test_the_census_reference_is_the_models_own_formula(tmp_path):
    """The op census compares the mode with each request alone (census._forward_row_by_row): there the injected
    norm computes the model's formula, as under the mode, though a prefill has many rows (in fp32 the split path's
    bf16 partials moved the trained demo's logits past fp32 rounding, and the census refused it). Control: the
    same forward outside that reference takes the split path and gets other bits."""
    from transformers import AutoModelForCausalLM

    from nondet.kernels.census import _forward, _forward_row_by_row, _inputs

    directory = save_family("qwen3", tmp_path / "qwen3")
    plain = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    injected = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    inject_batch_variance(injected)
    ids, mask = _inputs(plain)
    with torch.no_grad():
        want = _forward_row_by_row(plain, ids, mask)
        assert all(torch.equal(a, b) for a, b in zip(_forward_row_by_row(injected, ids, mask), want))
        split = [_forward(injected, ids[r:r + 1], mask[r:r + 1])[0] for r in range(ids.shape[0])]
    assert not torch.equal(torch.cat(split), want[0])  # the control: the prefill's many rows, split
