"""A live OpenAI-compatible server: the reference alone, then concurrent copies under load.

    source.py           the server source (`--endpoint URL`), with --resume
    against.py          two deployments of one model compared (`--against URL_B`)
    against_summary.py  summary.json "against": per side and across
    client.py           HTTP on the standard library: bounded retries, one-line errors
    responses.py        parse a completion answer: text, finish reason, logprobs
    compare.py          the level at which a server's answers can be compared
    engines.py          which serving engine a server is
    traffic.py          background filler requests; tally.py request counts for progress
The rl axis samples on a server too (rl/server.py). This package's __init__ imports nothing.
"""
