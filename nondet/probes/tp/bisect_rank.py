"""bisect on the ranks of one degree: every rank runs the same lockstep replays; rank 0 decides.

The lockstep (probes/bisect/lockstep.py) is the single-process one: all ranks replay the
reference and the divergent batch with their hooks on, forced to the same tokens (the logits
are replicated, so every rank forces the same ones). What a rank captures differs (column-
parallel outputs are its own shard), so the ablation's choices, which follow the captured
differences, are made on rank 0 alone: rank 0 broadcasts each replay it wants (op classes,
steps, stop at flip) before running it, the other ranks run what they receive until None.
"""

import dataclasses

from nondet.probes.bisect.ablation import run_ablation
from nondet.probes.bisect.bisect import kernel_scope
from nondet.probes.bisect.lockstep import run_lockstep
from nondet.probes.core.replay import DecodeSettings
from nondet.probes.tp.collective import TPTap
from nondet.probes.tp.job import BisectTask


def bisect_on_rank(rank: int, degree: int, model, tokenizer, task: BisectTask, settings: DecodeSettings):
    """Rank 0: {"main": Lockstep, "ablation": Ablation | None}; other ranks: None (they follow)."""

    def replay(request: tuple) -> object:
        ops, steps, stop_at_flip = request
        scope = kernel_scope(task.kernels, task.baseline + (ops or ()), model)
        horizon = dataclasses.replace(settings, max_new_tokens=steps or settings.max_new_tokens)
        return run_lockstep(model, tokenizer, task.reference, task.divergent, horizon, scope, stop_at_flip,
                            row=task.row, tap=TPTap)

    if rank != 0:
        while (request := _broadcast(None, degree)) is not None:
            replay(request)
        return None

    def ask(request: tuple):
        _broadcast(request, degree)
        return replay(request)

    main = ask((None, None, False))
    ablation = None
    if task.ablation and task.kernels == "default" and main.first_diff is not None:
        steps = main.steps if main.flip_step is None else main.flip_step + 1  # through the flip
        ablation = run_ablation(lambda ops: ask((tuple(ops), steps, True)), task.classes, main.first_diff)
    _broadcast(None, degree)  # the followers stop
    return {"main": main, "ablation": ablation}


def _broadcast(request, degree: int):
    """Rank 0's request to every rank (degree 1: nothing to send)."""
    if degree == 1:
        return request
    import torch.distributed as dist

    box = [request]
    dist.broadcast_object_list(box, src=0)
    return box[0]
