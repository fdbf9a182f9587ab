"""The default kernels' saved decode step fed one row of the attention mask where every row's is the same.

transformers' compiled generate hands each decode step its 4-d masks, (B, 1, T, L), one row per request.
CUDA's SDPA broadcasts a mask's batch dimension where it is 1, so a trace at batch 1 guards on the mask's
batch size being 1: on an H200 (torch 2.11, the GPU probe case, 2026-11-30) the default kernels' function traced at
batch 1 refused batch 2 ("attention_mask['full_attention'].size()[0] == 1") and a second function was traced,
27 s of a cold probe's 60 s default warm-up. Where no row of a generate call is padded, the rows of its
masks are the same values: the step is handed row 0 alone, (1, 1, T, L), which SDPA broadcasts over the
batch at every batch size, so the trace's guard on it is true for every call, and the mask's batch is
traced as the constant 1. The attention reads the same mask values either way (tests compare the streams
with NONDET_ONE_MASK_ROW=0). Under the mode the step already serves every batch size (ops._cut), and its
inputs are left as they are.
"""

import contextlib
import os

ENV = "NONDET_ONE_MASK_ROW"  # "0": every row's mask, as transformers builds them
SLOT_NOTE = "; one mask row"  # on a slot's kernels state: its function was traced on row 0's mask
_UNPADDED: list[bool] = []  # per generate call (unpadded_rows()): whether no row of it is padded


@contextlib.contextmanager
def unpadded_rows(attention_mask: list[list[int]]):
    """For a generate call on this (B, S) attention mask: the decode steps inside may share one mask row
    where no position of any row is padding."""
    _UNPADDED.append(all(all(v == 1 for v in row) for row in attention_mask))
    try:
        yield
    finally:
        _UNPADDED.pop()


def applies(ops_on: bool) -> bool:
    """Whether this step gets one mask row: the default kernels (no op class of the mode on), a generate
    call without padding, and not turned off."""
    return not ops_on and bool(_UNPADDED) and _UNPADDED[-1] and os.environ.get(ENV, "1") != "0"


def first_row(inputs: dict) -> dict:
    """The inputs with each 4-d mask (the tensor, or each in the dict per attention kind) cut to row 0."""
    masks = inputs.get("attention_mask")
    if isinstance(masks, dict):
        masks = {kind: _row_zero(mask) for kind, mask in masks.items()}
    else:
        masks = _row_zero(masks)
    return {**inputs, "attention_mask": masks}


def _row_zero(mask):
    return mask[:1] if getattr(mask, "dim", lambda: 0)() == 4 else mask
