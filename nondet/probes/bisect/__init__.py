"""bisect: where inside the model a batch-variance difference is born, and which kernel class
causes it (lockstep replay + per-op-class kernel ablation). See bisect.py."""

from nondet.probes.bisect.bisect import BisectConfig, BisectResult, run_bisect

__all__ = ["BisectConfig", "BisectResult", "run_bisect"]
