"""bisect on a toy model with exactly one deliberately batch-variant module.

The tiny Qwen3 runs under nondet's batch-invariant kernels (so MKL's own batch variance
cannot interfere), except for one RMSNorm replaced by a reduction whose chunking depends on
the batch: one fp32 reduction for a single row, 8 chunks with bf16 partial sums (like a
split-K reduction) when several rows decode together. Bisect must name that module, the
"norm" class and the first step where that module's target row really differs (the module
logs it: the oracle; the prefill takes the one-row path, so it is a decode step), the same
for the target at the first and at the last row of the batch, and with left padding.
"""

import pytest

from nondet.probes.core.batch import build_batch
from nondet.probes.core.conditions import Condition
from nondet.probes.core.replay import DecodeSettings

VARIANT = "model.layers.1.post_attention_layernorm"
STEPS = 6



def _chunked_norm(original):
    import torch

    class ChunkedRMSNorm(torch.nn.Module):
        """RMSNorm: one fp32 reduction per row, but 8 chunks with bf16 partial sums when
        several rows decode together (a split reduction whose split depends on the batch).

        `log` holds, per call, which rows' outputs differ from the one-row path on the same
        input: the oracle for the step at which bisect must find this module.
        """

        def __init__(self):
            super().__init__()
            self.weight, self.eps = original.weight, original.variance_epsilon
            self.log: list[tuple[int, list[bool]]] = []  # (batch size, per-row "differs")

        def forward(self, x):  # x: [batch, seq, hidden] bf16
            single = self._normalize(x, x.float().pow(2).mean(-1, keepdim=True))
            if not (x.shape[0] > 1 and x.shape[1] == 1):
                self.log.append((x.shape[0], [False] * x.shape[0]))
                return single
            partial = [c.pow(2).sum(-1, keepdim=True) for c in x.chunk(8, dim=-1)]  # bf16 sums
            total = partial[0]
            for p in partial[1:]:
                total = total + p
            out = self._normalize(x, total.float() / x.shape[-1])
            differs = (out.view(torch.int16) != single.view(torch.int16)).flatten(1).any(1)  # [batch]
            self.log.append((x.shape[0], differs.tolist()))
            return out

        def _normalize(self, x, variance):
            return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)

    return ChunkedRMSNorm()


def _expected_step(loaded, batch_size: int, row: int) -> int:
    """The first step of the batched run where the variant module's target row differs."""
    log = [flags for b, flags in loaded.model.get_submodule(VARIANT).log if b == batch_size]
    return next(step for step, flags in enumerate(log) if flags[row])


@pytest.fixture(scope="module")
def toy(tiny_model_dir):
    from nondet.probes.models.loading import ModelSpec, load_model

    loaded = load_model(ModelSpec(str(tiny_model_dir)))
    layer = loaded.model.get_submodule(VARIANT.rsplit(".", 1)[0])
    layer.post_attention_layernorm = _chunked_norm(layer.post_attention_layernorm)
    return loaded


def _invariant(model):
    from nondet.kernels import batch_invariant

    return lambda: batch_invariant(model=model)


def _lockstep(loaded, condition: Condition, row: int, temperature: float = 0.0):
    import dataclasses

    from nondet.probes.bisect.lockstep import run_lockstep

    tok = loaded.tokenizer
    target = tok("Tell me about Richard Feynman", add_special_tokens=False)["input_ids"]
    fillers = [tok("The quick brown fox jumps over the lazy dog", add_special_tokens=False)["input_ids"]]
    ref = build_batch(Condition("t/bs1/ref", "default", 1, (0,), "none"), target, fillers, tok.pad_token_id)
    div = dataclasses.replace(build_batch(condition, target, fillers, tok.pad_token_id), target_rows=(row,))
    settings = DecodeSettings(STEPS, temperature, 0)
    return run_lockstep(loaded.model, tok, ref, div, settings, _invariant(loaded.model))


def _attribution(ls) -> tuple:
    o = ls.first_diff
    return None if o is None else (o["step"], o["module"], o["op_class"], o["layer"])


def test_names_the_variant_module(toy):
    toy.model.get_submodule(VARIANT).log.clear()
    ls = _lockstep(toy, Condition("t/bs4/ends", "default", 4, (0, 3), "same-length"), 3)
    step = _expected_step(toy, 4, 3)
    assert step >= 1  # the prefill (step 0) takes the one-row path
    assert _attribution(ls) == (step, VARIANT, "norm", 1)
    assert ls.first_numeric_step == step
    assert all(not r["differs"] for r in ls.rows[1] if r["order"] < ls.first_diff["order"])


def test_row_alignment_first_and_last_row(toy):
    condition = Condition("t/bs4/ends", "default", 4, (0, 3), "same-length")
    toy.model.get_submodule(VARIANT).log.clear()
    first = _lockstep(toy, condition, 0)
    step_first = _expected_step(toy, 4, 0)
    toy.model.get_submodule(VARIANT).log.clear()
    last = _lockstep(toy, condition, 3)
    assert _attribution(first) == (step_first, VARIANT, "norm", 1)
    assert _attribution(last) == (_expected_step(toy, 4, 3), VARIANT, "norm", 1)
    assert _attribution(first)[1:] == _attribution(last)[1:]


def test_row_alignment_left_padded_batch(toy):
    """Ragged fillers pad the target row on the left: points are aligned on its real tokens."""
    ls = _lockstep(toy, Condition("t/bs3/ragged", "default", 3, (2,), "ragged"), 2)
    assert ls.first_diff is not None and ls.first_diff["module"] == VARIANT
    before = [r for r in ls.rows.get(0, []) if r["module"] in ("model.embed_tokens", "model.layers.0.input_layernorm")]
    assert ls.first_numeric_step > 0 or before and not any(r["differs"] for r in before)


def test_sampling_keeps_the_attribution(toy):
    """With temperature > 0 each request samples with its own seeded generator: same origin."""
    toy.model.get_submodule(VARIANT).log.clear()
    ls = _lockstep(toy, Condition("t/bs4/ends", "default", 4, (0, 3), "same-length"), 3, temperature=0.8)
    assert _attribution(ls) == (_expected_step(toy, 4, 3), VARIANT, "norm", 1)
