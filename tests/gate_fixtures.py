"""Synthetic streams and summaries for the gate's pure-Python tests (no model).

PIECES maps token ids to pieces; 9 is hostile text (markup, control characters, a newline
that could start a GitHub workflow command, a lone surrogate).
"""

from nondet.probes.core.diff import summarize

HOSTILE = "<b>&\x1b[31m\n::error::pwn|x\udcff"
PIECES = {1: "Richard", 2: " Feynman", 3: " was", 4: " born", 5: " in", 6: " Queens", 7: " New", 8: " York",
          9: HOSTILE}
A = [1, 2, 3, 4, 5, 6]
B = [1, 2, 3, 4, 5, 7]  # flips at step 5: " New" instead of " Queens"
C = [1, 2, 3, 9, 5, 6]  # flips at step 3 to the hostile piece
LP = -0.5


def stream(run_id, cond, tokens, position=0, ref=False, logprobs=None, kernels="default"):
    logprobs = logprobs or [LP] * len(tokens)
    steps = [{"token": t, "piece": PIECES[t], "logprob": float(lp).hex(), "margin": float(0.25).hex()}
             for t, lp in zip(tokens, logprobs)]
    return {"run_id": run_id, "condition_id": f"{kernels}/{cond}", "kernels": kernels, "position": position,
            "is_reference": ref, "steps": steps}


def summary_of(streams):
    """summary.json of one kernels mode's streams (as the probe writes it)."""
    modes = {}
    for mode in dict.fromkeys(s["kernels"] for s in streams):
        modes[mode] = summarize([s for s in streams if s["kernels"] == mode])
    return {"modes": modes, "verdict": "synthetic"}


def sweep(bs4=(A, A), bs8=(A, A), bs4_logprobs=None):
    """Reference + bs4/ends (2 runs) + bs8/ends (2 runs)."""
    streams = [stream(0, "bs1/ref", A, ref=True)]
    streams += [stream(1 + i, "bs4/ends", t, position=(0, 3)[i], logprobs=bs4_logprobs) for i, t in enumerate(bs4)]
    streams += [stream(3 + i, "bs8/ends", t, position=(0, 7)[i]) for i, t in enumerate(bs8)]
    return streams
