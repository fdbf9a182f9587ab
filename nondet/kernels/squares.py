"""An RMSNorm's mean of squares, recognised while a graph is traced, so one op computes it.

transformers' norms compute `h = x.to(torch.float32); h.pow(2).mean(-1, keepdim=True)` (or `.float()`,
`.square()`). Traced as written, Inductor writes the fp32 squares with a kernel of its own and the
mode's opaque mean reads them back: on the 8B shape's CUDA-graph prefill, one such kernel per norm
(145), ~0.65 ms of 20 (docs/benchmarks.md). ops.mean_sq reads x itself and sums the squares in
mean_last's order, so the traced mode (traced.py) routes such a mean there.

The pattern is followed by tags on the tensors the mode sees being made (tensor attributes, which
dynamo traces as side effects of the graph): an upcast remembers its bf16 / fp16 source, and a square
of that upcast the source. Only half types: their squares are exact in fp32, which is what lets the
kernel fuse the squaring into its sum without changing a bit (triton_rows._mean_sq_kernel); an fp32
model's norms keep aten's pow and the mean over the stored squares. A tensor that an in-place op or an
`out=` writes to is marked mutated, and a mean whose tags lead through a mutated tensor is left as
written: after a write the source would no longer give the squares that were taken. (The marks stay
on the tensors, the KV cache a forward writes included: an attribute nothing else reads.)
"""

import functools

import torch

from nondet.kernels.config import SQUARE_EXACT_DTYPES

UPCAST_OF = "_nondet_upcast_of"  # on h = x.float(): x
SQUARE_OF = "_nondet_square_of"  # on h.pow(2) where h = x.float(): x
MUTATED = "_nondet_mutated"  # on a tensor some op wrote to in place
IN_PLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                              "__imod__", "__ipow__", "__imatmul__", "__iand__", "__ior__", "__ixor__",
                              "__ilshift__", "__irshift__"})


def _tag_upcast(out, args, kwargs) -> None:
    src = args[0] if args else None
    if (isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor) and out is not src
            and out.dtype == torch.float32 and src.dtype in SQUARE_EXACT_DTYPES and out.shape == src.shape
            and out.device == src.device):
        setattr(out, UPCAST_OF, src)


def _is_two(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 2


def _tag_square(out, h) -> None:
    source = getattr(h, UPCAST_OF, None) if isinstance(h, torch.Tensor) else None
    if (source is not None and isinstance(out, torch.Tensor) and out.dtype == torch.float32
            and out.shape == h.shape and not mutated(h)):
        setattr(out, SQUARE_OF, source)


def _tag_pow(out, args, kwargs) -> None:
    exponent = args[1] if len(args) > 1 else kwargs.get("exponent")
    if _is_two(exponent):
        _tag_square(out, args[0] if args else kwargs.get("input"))


def _tag_square_call(out, args, kwargs) -> None:
    _tag_square(out, args[0] if args else kwargs.get("input"))


TAGS = {"upcast": _tag_upcast, "pow": _tag_pow, "square": _tag_square_call}
TAGGERS = {  # torch function -> the TAGS name of what tags its output
    torch.Tensor.to: "upcast", torch.Tensor.float: "upcast",
    torch.Tensor.pow: "pow", torch.pow: "pow",
    torch.Tensor.square: "square", torch.square: "square",
}


# Dynamo calls the two lookups below while it traces and keeps their answers as constants: looked up
# inline, a dict keyed by functions is guarded key by key in every compiled graph, and each guard is
# checked on every call (the write check alone added 252 guards to a decode step's graph).
@torch._dynamo.assume_constant_result
def tagger_name(func) -> str | None:
    """The TAGS name of the tagger for func's output, or None."""
    return TAGGERS.get(func)


@torch._dynamo.assume_constant_result
def writes_first_argument(func) -> bool:
    """Whether func writes its first argument (in_place_functions)."""
    return func in in_place_functions()


def mutated(t: torch.Tensor) -> bool:
    return getattr(t, MUTATED, False)


@functools.cache
def in_place_functions() -> dict:
    """{func: True} for every torch function that writes its first argument: Tensor methods named
    `name_`, in-place operators (`+=`, `x[i] = ...`) and torch's `name_` functions. A dict looked up
    by func: what dynamo traces without a graph break (a function's __name__ it cannot read)."""
    tensor = [getattr(torch.Tensor, n) for n in dir(torch.Tensor)
              if (n.endswith("_") and not n.endswith("__")) or n in IN_PLACE_DUNDERS]
    module = [getattr(torch, n) for n in dir(torch) if n.endswith("_") and not n.startswith("_")]
    return {f: True for f in tensor + module if callable(f)}


def mark_writes(func, args, kwargs) -> None:
    """Mark the tensor func writes to: the first argument of an in-place function (in_place_functions())
    or of one called with `inplace=True`, or an `out=` argument."""
    out = kwargs.get("out")
    target = out if out is not None else (args[0] if args and (writes_first_argument(func)
                                                                or kwargs.get("inplace") is True) else None)
    for t in target if isinstance(target, (tuple, list)) else (target,):
        if isinstance(t, torch.Tensor):
            setattr(t, MUTATED, True)


def squared_source(x: torch.Tensor) -> torch.Tensor | None:
    """The tensor whose fp32 squares x holds, where tags show it and nothing wrote to either since."""
    src = getattr(x, SQUARE_OF, None)
    if src is None or mutated(x) or mutated(src):
        return None
    return src
