"""Sources of target streams: each turns (a model or an endpoint, a condition) into StreamRecords.

    static.py      batched generate calls (batch sizes, positions, fillers, ragged batches)
    continuous.py  transformers' continuous-batching engine in process, Poisson filler arrivals
    server.py      a live OpenAI-compatible server: the reference alone, then concurrent copies

The probe loop (probes/probe.py: run_streams) plans, replays, writes and summarizes; a source
only produces records (base.py: the Source interface). Adding a source touches neither the
loop, the writer, the diff nor the report.
"""
