"""Bisect's capture points for the collective under tensor parallelism, on rank 0.

Every row-parallel linear (o_proj, down_proj: the plan styles in ROW_PARALLEL) ends with an
all-reduce that sums the ranks' partial products. transformers calls it as
`torch.distributed.all_reduce` from inside the module's forward (5.2x) or from a forward hook
registered when it sharded the model (4.5x-5.1x); either way the call falls between the
module's own pre-hook and a forward hook registered later. CollectiveTap wraps the all-reduce
for that span and hands the target row to the sink twice:
    "<linear>"              op class matmul: this rank's partial product, before the sum
    "<linear>.all_reduce"   op class collective: the sum (classify.COLLECTIVE_SUFFIX)
So between a solo and a batched replay at one degree, a first difference at ".all_reduce" with
equal partials names the collective (or another rank's partial: rank 0 sees only its shard of
K; the ranks run the same shapes, so a batch-dependent matmul shows on rank 0 as well).
Enter the tap inside the kernels mode of the replay: it wraps the all-reduce in use when it is
entered (the mode's invariant one, collective.py, or the backend's) and puts it back on exit.
TPTap is the lockstep's capture with these points added (bisect_rank.py passes it).
"""

import re

from nondet.probes.bisect import classify as cls
from nondet.probes.bisect.capture import Point, Sink, Tap, target_row

ROW_PARALLEL = ("rowwise", "rowwise_rep", "local_rowwise", "packed_rowwise")  # plan styles that all-reduce after


def row_parallel_paths(model) -> list[str]:
    """Module paths the model's TP plan shards row-wise (an all-reduce follows each), in model order."""
    prefix = getattr(model, "base_model_prefix", "model")
    plan = {f"{prefix}.{k}": v for k, v in (getattr(model.config, "base_model_tp_plan", None) or {}).items()}
    plan.update(getattr(model, "_tp_plan", None) or {})
    patterns = [re.compile(re.escape(k).replace(r"\*", r"\d+")) for k, v in plan.items() if v in ROW_PARALLEL]
    return [path for path, _ in model.named_modules() if any(p.fullmatch(path) for p in patterns)]


class CollectiveTap:
    """Context manager: the partial and the summed target row of every row-parallel linear's all-reduce.

    step(): the current step (the lockstep's Tap counts forward calls); sink(step, point, row)."""

    def __init__(self, model, row: int, batch_size: int, step, sink: Sink):
        self.model, self.row, self.batch_size, self.step, self.sink = model, row, batch_size, step, sink
        self.current: str | None = None  # the row-parallel linear running now
        self.inner = None  # the all-reduce wrapped while the tap is open
        self._handles: list = []

    def __enter__(self) -> "CollectiveTap":
        import torch.distributed as dist

        for path in row_parallel_paths(self.model):
            module = self.model.get_submodule(path)
            self._handles.append(module.register_forward_pre_hook(lambda m, args, path=path: self._enter(path)))
            self._handles.append(module.register_forward_hook(lambda m, args, out: self._enter(None)))
        self.inner, dist.all_reduce = dist.all_reduce, self._all_reduce
        return self

    def __exit__(self, *exc) -> None:
        import torch.distributed as dist

        try:
            assert dist.all_reduce == self._all_reduce, "all_reduce replaced while a CollectiveTap was open"
            dist.all_reduce = self.inner
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()

    def _enter(self, path: str | None) -> None:
        self.current = path

    def _all_reduce(self, tensor, *args, **kwargs):
        path = self.current
        before = target_row(tensor, self.row, self.batch_size) if path else None
        before = before.clone() if before is not None else None  # the all-reduce works in place
        result = self.inner(tensor, *args, **kwargs)
        after = target_row(tensor, self.row, self.batch_size) if path else None
        if before is not None and after is not None:
            layer = cls.layer_index(path)
            module = self.model.get_submodule(path)
            self.sink(self.step(), Point(path, cls.classify(path, module), layer, False), before)
            collective = path + cls.COLLECTIVE_SUFFIX
            self.sink(self.step(), Point(collective, cls.classify(collective, module), layer, False), after.clone())
        return result


class TPTap(Tap):
    """capture.Tap plus a CollectiveTap on the same step counter: every module point, and each
    row-parallel linear's partial and summed row around its all-reduce."""

    def __init__(self, model, row: int, batch_size: int, sink: Sink):
        super().__init__(model, row, batch_size, sink)
        self.collective = CollectiveTap(model, row, batch_size, lambda: self.step, sink)

    def __enter__(self) -> "TPTap":
        super().__enter__()
        try:
            self.collective.__enter__()
        except BaseException:
            super().__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.collective.__exit__(*exc)
        finally:
            super().__exit__(*exc)
