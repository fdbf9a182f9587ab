"""Load: the target prompt under traffic that changes every step.

`continuous` runs it inside transformers' own continuous-batching engine, in process, with
filler requests arriving as a seeded Poisson process. `server_probe` sends concurrent copies
of it, plus background fillers, to a live OpenAI-compatible server. Both write the same run
directory as the static probe. This package's __init__ imports nothing.
"""
