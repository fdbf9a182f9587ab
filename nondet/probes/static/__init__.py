"""Static batching: the target prompt in batches of other sizes, rows and fillers.

    source.py  the static source: one batched generate call per condition (the default load)
    budget.py  `--budget SECONDS`: plan the static sweep to fit a time budget
    bisect.py  rebuild a static condition's batches and replay them in lockstep
The tensor-parallel axis (tp/) runs these same conditions. This package's __init__ imports nothing.
"""
