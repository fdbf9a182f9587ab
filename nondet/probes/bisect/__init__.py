"""bisect's shared machinery: where inside the model a batch-variance difference is born, and
which kernel class causes it (lockstep replay + per-op-class kernel ablation). Each axis replays
its own computation through it (its bisect.py); `nondet bisect` of a probe run is
nondet.probes.bisect_probe.run_bisect. This package imports no axis."""

from nondet.probes.bisect.bisect import BisectConfig, BisectResult

__all__ = ["BisectConfig", "BisectResult"]
