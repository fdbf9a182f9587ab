"""nondet.rl.compare against values computed by hand (no model, no torch needed)."""

import math

import numpy as np
import pytest

from nondet.rl import compare


def test_identical_logprobs_give_zero_everything():
    lp = [[-0.5, -1.25, -3.0], [-0.125, -2.0, -0.75]]
    m = compare(lp, [row[:] for row in lp])
    assert m["n_tokens"] == 6 and m["n_identical"] == 6 and m["frac_identical"] == 1.0
    assert m["kl_k1"] == m["kl_k2"] == m["kl_k3"] == 0.0
    assert m["dlogp_max"] == 0.0 and m["ratio_outside_0.1"] == 0.0
    assert m["first_diff"] == [None, None] and m["seqs_differ"] == 0


def test_hand_computed_values():
    # sequence 0: tokens 1 differs by log 2 (trainer higher); sequence 1: token 0 differs by -0.05
    sampler = [[-1.0, -2.0], [-0.5, -0.25]]
    trainer = [[-1.0, -2.0 + math.log(2)], [-0.55, -0.25]]
    m = compare(sampler, trainer)
    d = [0.0, math.log(2), -0.05, 0.0]  # log r per token
    assert m["n_identical"] == 2 and m["frac_identical"] == 0.5
    assert m["dlogp_max"] == pytest.approx(math.log(2))
    assert m["dlogp_mean"] == pytest.approx((math.log(2) + 0.05) / 4)
    # r = 2 and exp(-0.05) = 0.951: outside [0.9, 1.1] only r = 2; outside [0.8, 1.2] only r = 2
    assert m["ratio_outside_0.1"] == 0.25 and m["ratio_outside_0.2"] == 0.25
    assert m["kl_k1"] == pytest.approx(sum(-x for x in d) / 4)
    assert m["kl_k2"] == pytest.approx(sum(x * x / 2 for x in d) / 4)
    assert m["kl_k3"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 4)
    assert m["first_diff"] == [1, 0] and m["seqs_differ"] == 2
    # p95 of |dlogp| = [0, 0, 0.05, log 2] with numpy's linear interpolation: 0.05 + 0.85 * (log 2 - 0.05)
    assert m["dlogp_p95"] == pytest.approx(0.05 + 0.85 * (math.log(2) - 0.05))


def test_mask_drops_tokens_and_ragged_lists_pad():
    sampler = [[-1.0, -9.0], [-0.5]]
    trainer = [[-1.0, -1.0], [-0.5]]
    assert compare(sampler, trainer)["n_identical"] == 2
    masked = compare(np.array([[-1.0, -9.0]]), np.array([[-1.0, -1.0]]), mask=[[1, 0]])
    assert masked["n_tokens"] == 1 and masked["frac_identical"] == 1.0 and masked["first_diff"] == [None]


def test_one_ulp_counts_as_different_bits():
    a = -0.5
    b = float(np.nextafter(np.float32(a), np.float32(0)))
    m = compare([[a]], [[b]])
    assert m["n_identical"] == 0 and m["kl_k3"] > 0 and m["first_diff"] == [0]


def test_torch_bf16_and_float32_inputs():
    torch = pytest.importorskip("torch")
    s = torch.tensor([[-0.5, -1.5]], dtype=torch.bfloat16)
    t = s.float()  # the exact same values in float32: bit-identical after the exact upcast
    assert compare(s, t)["frac_identical"] == 1.0


def test_values_are_plain_python_numbers():
    m = compare([[-1.0]], [[-1.1]])
    assert all(type(v) in (int, float) for k, v in m.items() if k != "first_diff")


def test_shape_mismatch_is_a_value_error():
    with pytest.raises(ValueError, match=r"sampler_logprobs has shape \(1, 2\) but trainer_logprobs \(1, 3\)"):
        compare([[-1.0, -2.0]], [[-1.0, -2.0, -3.0]])


def test_empty_mask_gives_nan_metrics():
    m = compare([[-1.0]], [[-2.0]], mask=[[0]])
    assert m["n_tokens"] == 0 and math.isnan(m["kl_k1"]) and m["first_diff"] == [None]
