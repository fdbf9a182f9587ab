"""Traffic: the machinery the continuous and server sources drive (probes/sources/).

arrivals (seeded Poisson filler schedules), engine (transformers' continuous-batching engine,
stepped in process), cb_attention (nondet's attention over its paged cache), client (HTTP to an
OpenAI-compatible server), responses (parsing its answers), compare (the level at which a
server's answers can be compared), tally (request counts for progress), traffic (background
filler requests). This package's __init__ imports nothing.
"""
