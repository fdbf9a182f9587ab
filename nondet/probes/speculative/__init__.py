"""Speculative decoding: plain greedy decoding vs assisted (speculative) decoding of one prompt.

    speculation.py     the `--speculative` forms (torch-free, parsed before any model loads)
    source.py          the speculative source: one condition per form, batch size 1
    summary.py         summary.json "speculative": each form against plain greedy
    default_draft.py   the embedded draft: the default model cut to its first layer(s)
    compiled_draft.py  the draft on the compiled path: K greedy tokens per round, static cache
    bisect.py          lockstep of one-token decoding vs the verification chunks
This package's __init__ imports nothing.
"""
