"""The shared core every axis builds on: conditions, batches, one generate call, records, the diff.

    conditions.py      the sweep: which batches to build around the target prompts
    batch.py           one condition's token batch: targets in their rows, fillers elsewhere
    corpus.py          the built-in filler prompts (and the default tokenizer's corpus)
    chat.py            chat formatting of a prompt, as a server formats /v1/chat/completions
    replay.py          one condition = one batched generate call -> the target rows' step dicts
    stop_after.py      a call stopped after N new tokens, its static cache keeping the run's length
    recorder.py        the logits processor that records each target row's step
    routing_trace.py   which experts each target token went to (mixtures of experts)
    compiled.py        the compiled decode path (--compile); static_caches.py its KV caches
    kernels_mode.py    the kernels of one call: the batch-invariant mode, or the default ones
    kernel_coverage.py what the mode covered, as the run directory and the verdict say it
    numerics.py        every numerics knob, set in one place, scoped, fingerprinted
    pieces.py          one token's text, bytes that are not UTF-8 kept visible
    source.py          the Source interface the probe loop drives; step_record
    load_config.py     the load settings of a probe (static, continuous, server)
    endpoint.py        --endpoint / --against URLs: checked with the config, compared as deployments
    arrivals.py        seeded Poisson arrival schedules (continuous and server fillers)
    diff.py            streams against their reference; diff_prompts.py several prompts merged
    summarize.py       streams -> summary.json's modes
Imports no axis: the axes (static/, continuous/, server/, speculative/, rl/, tp/) import it.
This package's __init__ imports nothing.
"""
