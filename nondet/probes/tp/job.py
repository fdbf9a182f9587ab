"""What one worker group runs: pickled to every rank when the group starts."""

from dataclasses import dataclass

from nondet.probes.core.replay import DecodeSettings
from nondet.probes.models.loading import ModelSpec

FAIL_ENV = "NONDET_TP_FAIL_RANK"  # test hook: "R" or "R:CODE" makes rank R exit with CODE before its first condition


@dataclass(frozen=True)
class BisectTask:
    """bisect at one degree: the lockstep of the prompt alone and one batched condition, then the ablation."""

    reference: object  # batch.Batch: the prompt alone at batch size 1
    divergent: object  # batch.Batch: the condition as the probe built it
    row: int  # the divergent condition's target row
    kernels: str  # the condition's kernels mode
    baseline: tuple[str, ...]  # op classes invariant in every replay
    ablation: bool  # rerun per op class (rank 0 decides which; the others follow)
    classes: tuple[str, ...]  # op classes the ablation tries ("collective" included)


@dataclass(frozen=True)
class Job:
    spec: ModelSpec  # the model, as for the static probe
    degree: int  # ranks in the group (1 = one process, no process group, no tp_plan)
    conditions: tuple  # conditions.Condition, in the order they run (the source's plan for this degree)
    inputs: tuple  # per prompt: (target ids, filler ids), tokenized once by the parent
    settings: DecodeSettings
    threads: int  # torch CPU threads per rank: the same at every degree, so TP1 vs TPN is not a thread count
    port: int  # the rendezvous port on 127.0.0.1 (gloo / NCCL)
    bisect: BisectTask | None = None  # instead of conditions: one bisect (rank 0 sends ("bisect", result))
    # TP-invariance (kernels/tp_tree.py): under the mode, row-parallel linears reduce K as a tree of
    # this many leaves (the largest degree of the run; this rank computes leaves / degree); 0 = off
    tree_leaves: int = 0
    # --compile: each rank decodes on transformers' compiled path (static/decoder.py), as the static probe
    compile_backend: str | None = None
