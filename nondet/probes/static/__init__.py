"""Static batching: the target prompt in batches of other sizes, rows and fillers.

    source.py  the static source: one batched generate call per condition (the default load)
    budget.py  `--budget SECONDS`: plan the static sweep to fit a time budget
    bisect.py  rebuild a static condition's batches and replay them in lockstep
    decoder.py        how one condition is decoded: eager, compiled, or from CUDA graphs
    compile_ahead.py  second processes: a later mode's step compiled, or (decode_ahead.py) the mode's
                      conditions decoded beside the probe, their rows handed over (rows_ahead.py)
    workers.py, auto_workers.py  --workers: a CPU probe's conditions decoded by N processes
The tensor-parallel axis (tp/) runs these same conditions. This package's __init__ imports nothing.
"""
