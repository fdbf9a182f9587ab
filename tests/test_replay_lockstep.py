"""bisect replays "exactly as the probe makes it": one generate call, the same streams bit for bit.

The probe's streams come from replay.generate_condition; bisect's lockstep replay calls the
same replay.generate with its hooks and forced tokens passed in. On the tiny model, the
reference bisect replays equals the probe's solo stream (token, logprob bits, top-k, margin),
and the divergent target's own choices equal the probe's stream of that row through the
first token divergence, greedy and sampled (each target row samples with the probe's seed).
"""

import re
from pathlib import Path

import pytest

from nondet.probes.core.batch import build_batch
from nondet.probes.core.conditions import Condition
from nondet.probes.core.replay import DecodeSettings, generate_condition

STEPS = 12


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from nondet.probes.models.loading import ModelSpec, load_model

    return load_model(ModelSpec(str(tiny_model_dir)))


def _batches(tok, condition: Condition):
    target = tok("Tell me about Richard Feynman", add_special_tokens=False)["input_ids"]
    fillers = [tok("The quick brown fox jumps over the lazy dog", add_special_tokens=False)["input_ids"]]
    ref = build_batch(Condition("t/bs1/ref", "default", 1, (0,), "none"), target, fillers, tok.pad_token_id)
    return ref, build_batch(condition, target, fillers, tok.pad_token_id)


def _through_flip(own: list[dict], probe: list[dict]) -> int:
    """Steps that share their history with the probe's run: through the first token flip."""
    flip = next((i for i, (a, b) in enumerate(zip(own, probe)) if a["token"] != b["token"]), None)
    return len(own) if flip is None else flip + 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lockstep_replays_the_probes_streams_bit_for_bit(tiny, temperature):
    from nondet.probes.bisect.lockstep import run_lockstep

    tok, row = tiny.tokenizer, 3
    ref, div = _batches(tok, Condition("t/bs4/ends", "default", 4, (0, 3), "same-length"))
    settings = DecodeSettings(STEPS, temperature, 7)
    probe_ref = generate_condition(tiny.model, tok, ref, settings)[0]
    probe_div = generate_condition(tiny.model, tok, div, settings)[row]
    ls = run_lockstep(tiny.model, tok, ref, div, settings, row=row)
    assert len(probe_ref) == STEPS  # the tiny model's random weights emit no EOS this early
    assert ls.reference == probe_ref
    n = _through_flip(ls.divergent, probe_div)
    assert ls.divergent[:n] == probe_div[:n]


def test_generate_is_called_in_one_place():
    package = Path(__file__).resolve().parents[1] / "nondet"
    callers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                     if re.search(r"\bmodel\.generate\(", p.read_text(encoding="utf-8")))
    assert callers == ["probes/core/replay.py"]
