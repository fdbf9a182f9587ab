"""Why the probe's first numeric divergence and bisect's first differing step agree or not.

They measure different things. The probe compares the sampled token's logprob bits (and the
token); bisect compares every captured activation of the target row. A difference that is
absorbed before the logits (transient: lasting.py) shows in bisect and never in the probe,
so bisect's step can be earlier. The replay's own logprob bits (first_logprob_step) are the
probe's measure taken on the replay: if they disagree with the probe, the replay did not
reproduce the probe's numerics.
"""


def numeric_agreement(probe: int | None, logprob: int | None, first: dict | None, lasting: dict | None,
                      transients: list[dict], steps: int) -> dict:
    """{"agree": bool, "note": one sentence} for bisect.json and its renderers.

    probe: the probe's first numeric divergence of the run; logprob: the same measure on the
    replay; first: bisect's first differing point; lasting: the lasting divergence's origin.
    """
    step = None if first is None else first["step"]
    if probe is not None and probe >= steps and (step is None or step >= steps):
        return _says(False, f"the probe's first numeric divergence (step {probe}) lies beyond the {steps} "
                            "replayed steps (rerun with a larger --max-steps)")
    if step == probe:
        return _says(True, "agree: nothing differs" if step is None else
                     f"agree: at step {step} the first differing activation also changed the sampled token's "
                     "logprob bits")
    if step is None or (probe is not None and step > probe):
        return _says(False, f"the probe's logprob bits differ from step {probe}, but in the replay no activation "
                            f"differs {'at all' if step is None else f'before step {step}'}: the replay did not "
                            "reproduce the probe's numerics (threads, library versions, device?)")
    return _says(False, _earlier(step, probe, logprob, lasting, transients))


def _earlier(step: int, probe: int | None, logprob: int | None, lasting: dict | None,
             transients: list[dict]) -> str:
    """Bisect's first differing step comes before the probe's: what happened in between."""
    probe_part = "no numeric divergence" if probe is None else f"first numeric divergence at step {probe}"
    absorbed = [t["step"] for t in transients if t["reach"] != "logits"]
    why = (f"the differences at step(s) {_steps(absorbed)} were absorbed before the logits"
           if absorbed else "the differences before it did not change the sampled token's logprob bits")
    note = (f"bisect's first differing activation is at step {step}, the probe's {probe_part} (the sampled "
            f"token's logprob bits): {why}")
    if lasting is not None and lasting["step"] == probe:
        note += f"; the lasting divergence, born at step {probe}, is the one the probe sees"
    if logprob != probe:
        note += (f"; the replay's own logprob bits first differ at step {logprob}, not {probe}: the replay "
                 "did not reproduce the probe's numerics exactly")
    return note


def _steps(steps: list[int], shown: int = 5) -> str:
    text = ", ".join(str(s) for s in steps[:shown])
    return text + (f" and {len(steps) - shown} more" if len(steps) > shown else "")


def _says(agree: bool, note: str) -> dict:
    return {"agree": agree, "note": note}
