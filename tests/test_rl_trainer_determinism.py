"""The RL trainer's forward measures the kernels and nothing else (CPU, tiny models).

Train mode without randomness (probes/rl/train_mode.py): models whose config turns randomness on
under names other than nn.Dropout's `p` (gpt_bigcode's attn_pdrop, Falcon's hidden_dropout read
inside forward, Mixtral's router jitter, PhiMoE's Gumbel-sampled routing). Positive control: the
same model's plain train-mode forward, twice, differs; negative: the trainer's forward, twice, is
bit-identical, and `nondet rl` under the mode is true on-policy. Randomness eval mode keeps is
refused in one line naming the module.

Packed rows (probes/rl/packed.py): refused on OPT and BLOOM, whose packed sequences see the one
before them; accepted on Llama and Qwen3, whose attention keeps them apart.
"""

import json

import pytest
import torch

import cli_runner
import family_models as fm
from nondet.errors import UnsupportedModelError, UsageError
from nondet.probes.models.default_model import build_tokenizer
from nondet.probes.models.loading import ModelSpec
from nondet.probes.rl.packed import refuse_leaky_packing
from nondet.probes.rl.train_mode import training
from nondet.rl.config import RLConfig
from nondet.rl.run import run_rl

IDS = list(range(10, 22))  # 12 ids: the probe sequence, and two sequences of a packed row
# family -> (config.json field, value as shipped: SantaCoder / StarCoder ship attn_pdrop 0.1, Phi-3.5-MoE jitter 0.01)
RANDOM = {"gpt-bigcode": ("attn_pdrop", 0.1), "falcon": ("hidden_dropout", 0.1),
          "mixtral": ("router_jitter_noise", 0.1)}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(512)


def saved(family, directory, tokenizer, **fields) -> str:
    """A tiny model of the family, config.json fields overridden."""
    fm.save_family(family, directory, tokenizer)
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return str(directory)


@pytest.fixture(scope="module")
def random_dirs(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("random")
    return {family: saved(family, root / family, tokenizer, **{key: value}) for family, (key, value) in RANDOM.items()}


def forward(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([IDS]), use_cache=False).logits


def two_train_forwards(model) -> tuple[torch.Tensor, torch.Tensor]:
    """Two forwards in plain train mode (what the trainer ran before train_mode.py)."""
    model.train()
    try:
        return forward(model), forward(model)
    finally:
        model.eval()


@pytest.mark.parametrize("family", sorted(RANDOM))
def test_the_trainers_forward_is_bit_identical_where_plain_train_mode_is_random(random_dirs, family):
    model = fm.load(random_dirs[family], torch.float32)
    first, second = two_train_forwards(model)
    assert not torch.equal(first, second)  # positive control: the config's randomness is on in train mode
    with training(model, IDS[:8]):
        assert model.training  # still a train-mode forward
        assert torch.equal(forward(model), forward(model))
    key, value = RANDOM[family]
    assert not model.training and getattr(model.config, key) == value  # restored after
    assert not torch.equal(*two_train_forwards(model))  # and random again outside the context


def test_phimoe_keeps_its_routing_threshold_and_drops_gumbel_sampling():
    """PhiMoE's router_jitter_noise is also the threshold its eval forward routes with: the trainer's forward
    must equal the eval forward bit for bit (a zeroed threshold would change the routing), not only itself."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(tf.PhimoeConfig(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, num_local_experts=8, num_experts_per_tok=2, router_jitter_noise=0.01,
        input_jitter_noise=0.01)).eval()
    fm._spread_weights(model)
    assert not torch.equal(*two_train_forwards(model))  # positive control: Gumbel sampling and jitter
    with training(model, IDS[:8]):
        trainer = forward(model)
        assert torch.equal(trainer, forward(model))
    assert torch.equal(trainer, forward(model))  # == eval mode, the sampler's forward


def test_randomness_eval_mode_keeps_is_refused_in_one_line(tmp_path, tokenizer):
    model = fm.load(fm.save_family("llama", tmp_path / "llama", tokenizer), torch.float32)
    with training(model, IDS[:8]):  # negative control: the plain model passes
        pass
    model = fm.load(tmp_path / "llama", torch.float32)  # a fresh model object: the search runs again
    model.model.layers[1].mlp.down_proj = fm.Noisy(model.model.layers[1].mlp.down_proj)
    with pytest.raises(UnsupportedModelError) as e:
        with training(model, IDS[:8]):
            pass
    assert "\n" not in str(e.value) and "model.layers.1.mlp.down_proj (Noisy)" in str(e.value)
    assert not model.training


@pytest.mark.parametrize("family", ["mixtral", "gpt-bigcode"])
def test_nondet_rl_is_true_on_policy_under_the_mode_with_train_mode_randomness_configured(random_dirs, family,
                                                                                          tmp_path):
    """Mixtral's jitter read as off-policy (and the gate failed); gpt_bigcode's attn_pdrop reached the invariant
    attention as a dropout, exit 70. Both: every logprob bit-identical, with the backward."""
    result = run_rl(RLConfig(model=ModelSpec(name=random_dirs[family], dtype="float32"), prompts=("one two three",
                             "four five six"), max_new_tokens=6, micro_batches=(1, 2), kernels=("batch-invariant",),
                             out=str(tmp_path / "run")))
    pairs = result.summary["rl"]["pairs"]
    assert len(pairs) == 2 and all(p["n_tokens"] == 12 and p["frac_identical"] == 1.0 for p in pairs)
    assert all(p["grad_finite"] for p in pairs)


@pytest.fixture(scope="module")
def packing_dirs(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("packing")
    return {family: fm.save_family(family, root / family, tokenizer) for family in ("opt", "bloom", "llama", "qwen3")}


@pytest.mark.parametrize("family", ["opt", "bloom"])
@pytest.mark.parametrize("mode", ["default", "batch-invariant"])
def test_packed_is_refused_where_packed_sequences_see_each_other(packing_dirs, family, mode):
    model = fm.load(packing_dirs[family], torch.float32)
    ids, positions = [IDS[:5] + IDS[5:]], [list(range(5)) + list(range(7))]
    with torch.no_grad():  # positive control: the packed row's 2nd sequence is not what it is alone
        row = model(input_ids=torch.tensor(ids), position_ids=torch.tensor(positions), use_cache=False).logits
        alone = model(input_ids=torch.tensor([IDS[5:]]), use_cache=False).logits
    assert float((row[0, 5:] - alone[0]).abs().max()) > 1e-3
    with pytest.raises(UsageError) as e, training(model, IDS[:8]):
        refuse_leaky_packing(model, IDS, (mode,))
    name = type(model).__name__
    assert str(e.value).startswith(f"--padding packed: {name} lets a packed sequence see the one before it")
    assert str(e.value).endswith("pass --padding right") and "\n" not in str(e.value)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_packed_is_accepted_where_attention_keeps_packed_sequences_apart(packing_dirs, family):
    model = fm.load(packing_dirs[family], torch.float32)
    with training(model, IDS[:8]):
        refuse_leaky_packing(model, IDS, ("default", "batch-invariant"))


def test_cli_refuses_packed_on_opt_in_one_line_and_runs_it_on_llama(packing_dirs, tmp_path):
    def rl(family):
        return cli_runner.run(["rl", "--model", packing_dirs[family], "--prompts", prompts, "-n", "4", "--micro-batch",
                               "2", "--padding", "packed", "--no-backward", "--dtype", "float32",
                               "--out", tmp_path / family])

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one two three\nfour five six\n")
    refused = rl("opt")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "OPTForCausalLM" in refused.stderr and "--padding right" in refused.stderr
    assert not (tmp_path / "opt").exists()  # refused before the sampler ran: nothing sampled, no run directory
    accepted = rl("llama")
    assert accepted.returncode == 0, accepted.stderr
