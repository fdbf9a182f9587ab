"""The model-family matrix: under the batch-invariant mode, every family people serve is invariant,
correct, and its positive control fires (tests/family_models.py builds the models).

Per family and dtype:
  (a) invariant: row 0 alone vs the same row in a batch of 4 different same-length prompts, 24
      greedy steps of HF generate, logits bitwise equal at every step;
  (b) correct: the mode's prefill logits within TOLERANCE (relative L2) of the default kernels'.
      fp32: 1e-5 (measured <= 4e-7: only summation order differs). bf16: 2e-2 (measured <= 9.4e-3:
      the mode keeps fp32 accumulators where default kernels round partial results to bf16, about
      one bf16 ulp, 7.8e-3, on logits of order 1);
  (c) the positive control fires: with the final norm made batch-variant on purpose
      (family_models.BatchVariantNorm, a split sum of squares when the call has several rows), the
      same comparison under the same mode reports a difference, so (a) can fail on every machine.
"""

import pytest
import torch

import family_models as fm
from nondet.kernels import batch_invariant

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: fm.save_family(name, root / name) for name in fm.FAMILIES}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", fm.FAMILIES)
def test_family_under_the_mode(family, dtype, family_dirs):
    model = fm.load(family_dirs[family], dtype)
    ids = fm.prompts()

    def scope():
        return batch_invariant(model=model)

    assert fm.invariance(model, ids, scope) is None, "row 0 alone differs from row 0 in a batch of 4"
    assert fm.prefill_error(model, ids, scope) < TOLERANCE[dtype]
    with fm.batch_variance(model):
        assert fm.invariance(model, ids, scope) is not None, "the positive control did not fire"
    assert model.config._attn_implementation != "nondet_batch_invariant", "the mode did not restore attention"


def test_an_experts_module_the_mode_cannot_reach_is_refused_in_one_line(family_dirs):
    """A family whose experts compute outside transformers' ExpertsInterface and without nn.Linear
    (here: Qwen3-MoE's experts with the dispatching decorator undone) is refused, naming the module."""
    from nondet.kernels.coverage import UnsupportedModel

    model = fm.load(family_dirs["qwen3-moe"], torch.float32)
    experts = model.model.layers[0].mlp.experts
    plain = type("FusedExperts", (torch.nn.Module,), {"forward": lambda self, *a: a[0]})
    experts.__class__ = type("Qwen3MoeFusedExperts", (plain,), {"__module__": "transformers.fused"})
    with pytest.raises(UnsupportedModel) as info:
        with batch_invariant(model=model):
            pass
    message = str(info.value)
    assert "\n" not in message and "model.layers.0.mlp.experts" in message and "ExpertsInterface" in message


@pytest.mark.parametrize("family", ["gemma2", "gpt-oss"])
def test_softcap_and_sinks_families_end_to_end_through_the_cli(family, tmp_path):
    """probe --confirm and bisect on Gemma 2 (softcap) and gpt-oss (sinks + MoE): the mode gives one
    completion with identical bits; the positive control makes default kernels differ."""
    import json
    import subprocess
    import sys

    from nondet.probes.default_model import build_tokenizer

    model = fm.save_family(family, tmp_path / family, tokenizer=build_tokenizer(512))
    run = tmp_path / "run"
    probe = subprocess.run([sys.executable, "-m", "nondet", "probe", "--model", model, "--dtype", "float32",
                            "-p", "Tell me about Richard Feynman", "-b", "1,4", "-n", "8", "--inject-variance",
                            "--confirm", "--out", str(run)], capture_output=True, text=True, timeout=600)
    assert probe.returncode == 0, probe.stderr[-2000:]
    modes = json.loads((run / "summary.json").read_text())["modes"]
    assert modes["batch-invariant"]["distinct_completions"] == 1
    assert modes["batch-invariant"]["first_numeric_divergence"] is None
    assert modes["default"]["first_numeric_divergence"] is not None
    bisect = subprocess.run([sys.executable, "-m", "nondet", "bisect", str(run)], capture_output=True, text=True,
                            timeout=600)
    assert bisect.returncode == 0, bisect.stderr[-2000:]
    result = json.loads((run / "bisect.json").read_text())
    assert result["origin"]["op_class"] != "other" and result["minimal_set"]
