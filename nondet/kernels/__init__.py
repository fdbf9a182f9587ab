"""Batch-invariant kernels and the mode that switches them on.

A row's result depends only on that row: never on the batch size, its position in the batch,
or what the other rows hold. Triton kernels on CUDA (one fixed configuration per dtype, fp32
dots in IEEE precision), a row-blocked path on the CPU, and `batch_invariant()`, which routes
a transformers model's aten ops and attention to them. Importing this package changes no
numerics; it imports torch but not triton or transformers.
"""

from nondet.kernels.hf import ATTN_IMPLEMENTATION
from nondet.kernels.mode import OP_CLASSES, active_ops, batch_invariant, is_active
from nondet.kernels.ops import (
    addmm,
    attention,
    bmm,
    layer_norm,
    linear,
    log_softmax,
    mean_last,
    mm,
    rms_norm,
    softmax,
)

__all__ = [
    "ATTN_IMPLEMENTATION",
    "OP_CLASSES",
    "active_ops",
    "addmm",
    "attention",
    "batch_invariant",
    "bmm",
    "is_active",
    "layer_norm",
    "linear",
    "log_softmax",
    "mean_last",
    "mm",
    "rms_norm",
    "softmax",
]
