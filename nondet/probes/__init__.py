"""Probes: load a model, replay a prompt under many batch conditions, diff the streams.

    probe.py         `nondet probe` as a library call: ProbeConfig, the one loop over a source
    inmemory.py      the probe on a model already in memory, nothing written (pytest plugin)
    bisect_probe.py  `nondet bisect` of a probe run: a static or speculative replay in lockstep
    ahead_process.py the second process that compiles a later kernels mode's step, or decodes the mode's
                     conditions beside the probe (static/compile_ahead.py, static/decode_ahead.py)
    core/            what every axis shares: conditions, batches, one generate call, the diff
    models/          which model, and how it is loaded (the embedded default, the demo model)
    bisect/          bisect's shared machinery: lockstep, capture, op classes, ablation
    static/ continuous/ server/ speculative/ rl/ tp/
                     one package per axis: its source, its summary, its bisect side
Imports point down this list: the root picks an axis, an axis uses bisect/, models/ and
core/ (tp/ also the static axis it parallelises; rl/ also the continuous engine and the server
client it samples with), and core/ imports no axis. Modules here may import torch inside
functions; this package's __init__ imports nothing.
"""
