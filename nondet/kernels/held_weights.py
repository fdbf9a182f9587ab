"""Weights re-laid out for --tp-invariant's tree (a rank's K chunks), made once and held while the weights live.

A copy made at every call would read and write those weights again at every step (and, traced, put the
copies in the graph); made once, they cost their size in memory for as long as the model is loaded. They
are made again after an in-place write (an RL update), which bumps the weight's version counter.
"""

import torch
from torch.utils.weak import WeakIdKeyDictionary


def local(weight: torch.Tensor) -> torch.Tensor:
    """The rank's own shard of a tensor-parallel weight (a DTensor), or the weight itself."""
    return weight.to_local() if hasattr(weight, "to_local") else weight


def version(weight: torch.Tensor) -> int | None:
    try:
        return weight._version  # bumped by every in-place write
    except RuntimeError:  # an inference tensor has no version counter (and cannot be written outside inference)
        return None


def held(table: WeakIdKeyDictionary, owner: torch.Tensor, key: tuple, make):
    """make()'s result, made once per (key, owner's version) and returned again after. `table` holds it only
    while `owner` lives, so make()'s result must not refer to `owner` (nor to its module)."""
    full_key = (key, version(owner))
    entry = table.get(owner)
    if entry is None or entry[0] != full_key:
        entry = table[owner] = (full_key, make())
    return entry[1]


def static(tensor: torch.Tensor) -> torch.nn.Parameter:
    """`tensor` as a Parameter: dynamo marks it a static input, so CUDA graphs neither copy it at each replay,
    as they copy other inputs, nor capture again for a new address."""
    return torch.nn.Parameter(tensor, requires_grad=False)
