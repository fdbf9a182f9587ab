"""Tensor-parallel linears with plain local shards as parameters, for inference.

transformers shards a TP model's weights as DTensors. At inference its column- and row-parallel
nn.Linear layers already compute on the local shard (the DTensor is swapped for its local tensor
around each forward; the row-parallel output is all-reduced as a plain tensor). The DTensor
parameters still cost every call of a compiled step on the host: dynamo checks guards on each one,
and the compiled graph unwraps each tensor subclass at its boundary. On 2 H200s (2026-11-28, 8 layers
of the 8B shape, compiled, B = 1) TP2's step took 3.43 ms against one GPU's 2.71 ms while its GPU time
was lower (1.04 vs 1.45 ms a step): dynamo's cache lookup 0.76 vs 0.25 ms a call, the compiled
region's own host time 0.72 vs 0.11 ms.

Inside `local_linear_params`, each such Linear's DTensor parameters are replaced by plain
parameters holding the same local shard (no copy: to_local is a view of the shard), so the
layers' forward takes transformers' local inference path with identical arithmetic; the DTensors
go back in `finally`. Only Linears whose weight is sharded on one dimension (Shard(0): column,
Shard(1): row) are touched; embeddings and anything else keep their DTensors. A forward inside must
run without gradients (generate's): with gradients the styles compute in DTensors, and a plain
parameter there fails loudly (torch refuses to mix Tensor and DTensor), it does not compute wrong.
"""

import contextlib


def shard_linears(model) -> list[tuple[object, str]]:
    """(module, parameter name) of every nn.Linear parameter that is a DTensor sharded on one dim."""
    import torch

    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:  # a torch without DTensor has no TP model
        return []
    found = []
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or not isinstance(module.weight, DTensor):
            continue
        placements = module.weight.placements
        if len(placements) != 1 or not isinstance(placements[0], Shard):
            continue
        found += [(module, name) for name, p in module.named_parameters(recurse=False)
                  if isinstance(p, DTensor) and all(isinstance(q, (Shard, Replicate)) for q in p.placements)]
    return found


@contextlib.contextmanager
def local_linear_params(model):
    """Inside: the TP linears' DTensor parameters are plain parameters of their local shards; yields
    how many were swapped (0 for a model that is not tensor-parallel)."""
    import torch

    swapped = []
    try:
        for module, name in shard_linears(model):
            original = module._parameters[name]
            module._parameters[name] = torch.nn.Parameter(original.to_local(), requires_grad=False)
            swapped.append((module, name, original))
        yield len(swapped)
    finally:
        for module, name, original in swapped:
            module._parameters[name] = original
