"""OPT's LayerDrop in the RL trainer's train-mode forward (probes/rl/train_mode.py).

transformers 5.17 (the floor pyproject allows) draws LayerDrop's number in OPTDecoder's train-mode forward
whatever the rate (`if self.training: torch.rand([])`, once per layer; 5.24 guards it with
`self.layerdrop > 0.0`). At rate 0 the draw skips nothing, but the batch-invariant mode's op census saw an
aten::rand and refused OPT for `nondet rl` ("model.decoder: aten::rand is not covered ..."). The tests put
that unguarded draw back (`unguarded_layerdrop`) and take each census afresh (census._CACHE emptied: a
census cached by another test would hide the draw). Controls: the same draw in a module that keeps no
LayerDrop rate is still refused by the op census, and noise eval mode keeps is still refused by the
trainer's search.
"""

import pytest
import torch

import family_models as fm
from nondet.errors import UnsupportedModelError
from nondet.kernels import census
from nondet.probes.core.kernels_mode import kernels_mode
from nondet.probes.models.default_model import build_tokenizer
from nondet.probes.models.loading import ModelSpec
from nondet.probes.rl.train_mode import training
from nondet.rl.config import RLConfig
from nondet.rl.run import run_rl

IDS = list(range(10, 18))


@pytest.fixture(scope="module")
def opt_dir(tmp_path_factory):
    return fm.save_family("opt", tmp_path_factory.mktemp("opt") / "opt", build_tokenizer(512))


@pytest.fixture(autouse=True)
def fresh_census(monkeypatch):
    monkeypatch.setattr(census, "_CACHE", {})


def draw_in_train_mode(monkeypatch, cls) -> None:
    """cls.forward preceded, in train mode, by one torch.rand([]) per OPT layer compared with the module's
    LayerDrop rate (0: nothing skipped), as OPTDecoder's forward drew it in earlier transformers."""
    original = cls.forward

    def forward(self, *args, **kwargs):
        if self.training:
            for _ in range(fm.LAYERS):
                assert not torch.rand([]) < getattr(self, "layerdrop", 0.0)  # rate 0: never true
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", forward)


@pytest.fixture
def unguarded_layerdrop(monkeypatch):
    from transformers.models.opt.modeling_opt import OPTDecoder

    draw_in_train_mode(monkeypatch, OPTDecoder)


def test_nondet_rl_on_opt_is_true_on_policy_under_the_mode_with_an_unguarded_layerdrop_draw(opt_dir, tmp_path,
                                                                                            unguarded_layerdrop):
    """Without train_mode.py's LayerDrop rule: UnsupportedModelError, 'model.decoder: aten::rand is not covered
    by the batch-invariant mode'. With it: the trainer's forward (decoder's own code in eval mode, its layers in
    train mode) has every logprob bit-identical to the sampler's."""
    result = run_rl(RLConfig(model=ModelSpec(name=opt_dir, dtype="float32"), prompts=("one two three", "four five six"),
                             max_new_tokens=4, micro_batches=(1, 2), kernels=("batch-invariant",), backward=False,
                             out=str(tmp_path / "run")))
    pairs = result.summary["rl"]["pairs"]
    assert len(pairs) == 2 and all(p["n_tokens"] == 8 and p["frac_identical"] == 1.0 for p in pairs)


def forward(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([IDS]), use_cache=False).logits


def test_the_trainers_forward_keeps_opts_layers_in_train_mode_and_draws_nothing(opt_dir, unguarded_layerdrop):
    model = fm.load(opt_dir, torch.float32)
    evaluated = forward(model)
    with training(model, IDS):
        decoder = model.model.decoder
        assert not decoder.training and all(layer.training for layer in decoder.layers)  # train mode below it
        assert torch.equal(forward(model), evaluated)  # every rate 0: train mode's numbers are eval mode's
        with kernels_mode("batch-invariant", model):  # the op census, taken in train mode
            pass
    assert [use for found in census._CACHE.values() for use in found.uses if "rand" in use.op] == []
    assert not decoder.training and not model.training  # eval mode, as loaded, restored


def test_control_the_same_draw_outside_a_layerdrop_owner_is_still_refused(opt_dir, monkeypatch):
    """The rule is LayerDrop's alone: a layer (no `layerdrop` of its own, train mode) that draws is refused."""
    from transformers.models.opt.modeling_opt import OPTDecoderLayer

    draw_in_train_mode(monkeypatch, OPTDecoderLayer)
    model = fm.load(opt_dir, torch.float32)
    with pytest.raises(UnsupportedModelError) as e, training(model, IDS), kernels_mode("batch-invariant", model):
        pass
    assert str(e.value).startswith("model.decoder.layers.0: aten::rand is not covered by the batch-invariant mode")


def test_control_noise_eval_mode_keeps_is_still_refused(opt_dir, unguarded_layerdrop):
    model = fm.load(opt_dir, torch.float32)
    model.model.decoder.layers[1].fc2 = fm.Noisy(model.model.decoder.layers[1].fc2)
    with pytest.raises(UnsupportedModelError) as e, training(model, IDS):
        pass
    assert "\n" not in str(e.value) and "model.decoder.layers.1.fc2 (Noisy)" in str(e.value)
