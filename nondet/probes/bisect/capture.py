"""Forward hooks that capture the target request's row at every point of the model.

A point is a leaf module's output (embedding, q_proj, q_norm, act_fn, lm_head, ...), a
decoder layer's output (the residual stream) or the attention core's output. The core
(SDPA / flash / eager attention) is a function call inside the attention module, not a
module, so it is captured as the INPUT of the attention output projection (o_proj,
c_proj, ...) and named "<attention module>.core"; otherwise a difference born in the
attention kernel would be blamed on o_proj. Points fire in execution order.

Only the target row is kept: row `row` of the batch dimension, then along the sequence
axis the last positions (left padding puts the real tokens last; compare.py's caller
trims to the reference's length). A tensor whose first dimension is neither the batch
size nor 1 cannot be aligned and is not captured.
"""

from dataclasses import dataclass
from typing import Callable

from nondet.probes.bisect import classify as cls

CORE_SUFFIX = ".core"  # module path of the attention core point: "<attention module>.core"


@dataclass(frozen=True)
class Point:
    module: str  # module path; the attention core is "<attention module>.core"
    op_class: str  # one of classify.OP_CLASSES
    layer: int | None  # decoder layer index, None outside the layers
    block: bool  # True for a decoder layer's output: the residual stream
    top_k: int | None = None  # a MoE router point: how many experts each token takes


Sink = Callable[[int, Point, object], None]  # (step, point, target-row tensor [seq, ...])


def capture_points(model) -> list[tuple[Point, object, bool]]:
    """(point, module to hook, hook its input?) for every point, in registration order."""
    points = []
    inside_experts = ()  # paths of experts modules: their children run once per expert, on its tokens only
    for path, module in model.named_modules():
        if inside_experts and path.startswith(inside_experts):
            continue
        op_class = cls.classify(path, module)
        if op_class == "experts":
            inside_experts += (path + ".",)
        leaf = next(module.children(), None) is None or op_class in FLAT
        if (leaf and not cls.is_skipped(module)) or cls.is_block(path):
            op_class = "other" if cls.is_block(path) else op_class
            points.append((Point(path, op_class, cls.layer_index(path), cls.is_block(path), _top_k(module, op_class)),
                           module, False))
        projection = cls.output_projection(path, module)
        if projection:
            core = Point(path + CORE_SUFFIX, "attention", cls.layer_index(path), False)
            points.append((core, module.get_submodule(projection), True))
    return points


class Tap:
    """Context manager: hooks every point of `model` and feeds the target row to `sink`.

    `step` counts forward calls of the whole model: 0 = the prefill, then one per token.
    """

    def __init__(self, model, row: int, batch_size: int, sink: Sink):
        self.model, self.row, self.batch_size, self.sink = model, row, batch_size, sink
        self.step = -1
        self._handles: list = []

    def __enter__(self) -> "Tap":
        try:
            self._handles.append(self.model.register_forward_pre_hook(self._next_step))
            for point, module, on_input in capture_points(self.model):
                self._handles.append(self._hook(point, module, on_input))
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._remove()

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _next_step(self, module, args) -> None:
        self.step += 1

    def _hook(self, point: Point, module, on_input: bool):
        if on_input:
            return module.register_forward_pre_hook(lambda m, args: self._emit(point, args))
        return module.register_forward_hook(lambda m, args, out: self._emit(point, out))

    def _emit(self, point: Point, value) -> None:
        t = first_tensor(value)
        if point.op_class in FLAT and t is not None and t.dim() >= 1 and t.shape[0] % self.batch_size == 0:
            t = t.reshape(self.batch_size, -1, *t.shape[1:])  # tokens back to [batch, seq, ...]
        row = target_row(t, self.row, self.batch_size)
        if row is not None:
            self.sink(self.step, point, row)


FLAT = ("router", "experts")  # points whose tensors are the batch's tokens flattened: (batch * seq, ...)


def _top_k(module, op_class: str) -> int | None:
    if op_class != "router":
        return None
    config = getattr(module, "config", None)
    return getattr(module, "top_k", None) or getattr(config, "num_experts_per_tok", None)


def first_tensor(value):
    """The tensor a module returned: itself, or the first tensor of a tuple / ModelOutput."""
    import torch

    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    return next((v for v in items if isinstance(v, torch.Tensor)), None)


def target_row(t, row: int, batch_size: int):
    """[batch, seq, ...] -> the target's [seq, ...] (detached); [1, ...] is shared by all rows."""
    if t is None or t.dim() < 1:
        return None
    if t.shape[0] == batch_size:
        return t[row].detach()
    if t.shape[0] == 1:
        return t[0].detach()
    return None
