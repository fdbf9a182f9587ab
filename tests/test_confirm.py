"""Acceptance on the CPU: the embedded default is batch-invariant under the mode.

Without the mode the same probe diverges (positive control); with it, batch sizes 1..32 with
the target in every row give one completion and bit-identical logprobs at every step.
"""

import json

import pytest

from nondet.probes.corpus import DEMO_PROMPTS
from nondet.probes.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe

TOKENS = 110  # long enough for the default model's real-kernel flips on some CPUs (step ~93 on one)


def _streams(run_dir, kernels):
    lines = (run_dir / "streams.jsonl").read_text().splitlines()
    return [s for s in map(json.loads, lines) if s["kernels"] == kernels]


def test_confirm_default_diverges_and_invariant_does_not(tmp_path):
    # One norm is made batch-variant on purpose (the positive control fires on every host, not
    # only where the host's BLAS happens to be batch-variant); the mode's norm class fixes it,
    # and its matmul / attention classes fix whatever the host's kernels add.
    cfg = ProbeConfig(prompts=DEMO_PROMPTS[:4], model=ModelSpec(inject_variance=True), batch_sizes=(1, 8),
                      placement="last", max_new_tokens=80, out=str(tmp_path / "run"),
                      kernels=("default", "batch-invariant"))
    modes = run_probe(cfg).summary["modes"]
    assert modes["default"]["prompts_bits_differ"] == 4  # positive control: every prompt's bits
    # by the first decode step (1: the injected norm's split path); on hosts whose own kernels are
    # batch-variant in the prefill too (an Intel Xeon with torch 2.13's CPU BLAS) already at step 0
    assert modes["default"]["first_numeric_divergence"] in (0, 1)
    assert modes["batch-invariant"]["distinct_completions"] == 1
    assert modes["batch-invariant"]["prompts_bits_differ"] == 0
    assert modes["batch-invariant"]["first_numeric_divergence"] is None


@pytest.mark.slow
def test_invariant_mode_over_batch_sizes_1_to_32_all_positions(tmp_path):
    cfg = ProbeConfig(batch_sizes=tuple(range(1, 33)), placement="all", max_new_tokens=TOKENS,
                      out=str(tmp_path / "run"), kernels=("batch-invariant",))
    m = run_probe(cfg).summary["modes"]["batch-invariant"]
    assert m["n_runs"] == sum(range(1, 33))  # the target in every row of every batch
    assert m["distinct_completions"] == 1
    assert m["first_numeric_divergence"] is None
    # Bit-identical at every step, not only the chosen token: logprob, top-5 and margin.
    streams = _streams(tmp_path / "run", "batch-invariant")
    ref = next(s for s in streams if s["is_reference"])["steps"]
    for s in streams:
        assert s["steps"] == ref, f"run {s['run_id']} ({s['condition_id']} row {s['position']}) differs"
