"""bisect.json's reproduction keys (probes/bisect/reproduced.py): the same tokens and bits, then one
logprob bit off (tokens still reproduced, bits not), then a token off, then no reference stream kept."""

import struct

from nondet.probes.bisect.reproduced import replay_record, reproduced
from nondet.probes.core.replay import DecodeSettings


def _next_float(x: float) -> float:
    """The float one unit in the last place above x (a logprob that differs in its last bit)."""
    return struct.unpack("<d", struct.pack("<q", struct.unpack("<q", struct.pack("<d", x))[0] + 1))[0]


STEPS = [{"token": 11, "logprob": -0.25}, {"token": 7, "logprob": -1.5}, {"token": 3, "logprob": -0.125}]
STREAMS = [{"run_id": 0, "steps": STEPS}, {"run_id": 4, "steps": [{"token": 9, "logprob": -3.0}] * 3}]


def test_the_probes_own_steps_are_reproduced_over_the_steps_replayed():
    assert reproduced([dict(s) for s in STEPS], STREAMS, 0) == {"reference_reproduced": True,
                                                                "reference_bits_reproduced": True}
    assert reproduced([dict(s) for s in STEPS[:2]], STREAMS, 0)["reference_bits_reproduced"] is True  # a shorter replay


def test_one_bit_off_keeps_the_tokens_and_loses_the_bits():
    off = [dict(s) for s in STEPS]
    off[2]["logprob"] = _next_float(off[2]["logprob"])
    assert off[2]["logprob"] != STEPS[2]["logprob"]
    assert reproduced(off, STREAMS, 0) == {"reference_reproduced": True, "reference_bits_reproduced": False}


def test_another_token_is_not_reproduced_and_a_missing_stream_is_unknown():
    other = [dict(s) for s in STEPS]
    other[1]["token"] = 8
    assert reproduced(other, STREAMS, 0) == {"reference_reproduced": False, "reference_bits_reproduced": False}
    assert reproduced(STEPS, STREAMS, 2) == {"reference_reproduced": None, "reference_bits_reproduced": None}


def test_the_replay_record_names_the_cache_and_a_compiled_probe():
    settings = DecodeSettings(5, 0.0, 0, kv_cache="static", cache_tokens=40)
    assert replay_record(settings, {"compile_backend": "inductor"}) == {
        "kv_cache": "static", "cache_tokens": 40, "probe_compiled": True}
    assert replay_record(DecodeSettings(5, 0.0, 0), {})["probe_compiled"] is False


def test_a_baselines_replay_is_named_as_the_reason_for_other_bits():
    from nondet.verdict import replay_line

    bits = {"reference_reproduced": True, "reference_bits_reproduced": False, "replay": {"probe_compiled": False}}
    assert "other threads" in replay_line(bits)
    assert "matmul + attention batch-invariant" in replay_line({**bits, "baseline": ["matmul", "attention"]})
    assert replay_line({**bits, "reference_bits_reproduced": True, "baseline": ["matmul"]}) is None
