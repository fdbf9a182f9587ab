"""Tensor-parallel linears with plain local shards as parameters, for inference.

transformers shards a TP model's weights as DTensors. At inference its column- and row-parallel
nn.Linear layers already compute on the local shard (the DTensor is swapped for its local tensor
around each forward; the row-parallel output is all-reduced as a plain tensor). The DTensor
parameters still cost every call of a compiled step on the host: dynamo checks guards on each one,
and the compiled graph unwraps each tensor subclass at its boundary. On an H200 host (2026-11-28, 8
layers of the 8B shape, compiled, B = 1) TP2's step took 3.43 ms against one GPU's 2.71 ms while its GPU time
was lower (1.04 vs 1.45 ms a step): dynamo's cache lookup 0.76 vs 0.25 ms a call, the compiled
region's own host time 0.72 vs 0.11 ms.

Inside `local_linear_params`, each such Linear's DTensor parameters are replaced by plain
parameters holding the same local shard (no copy: to_local is a view of the shard), so the
layers' forward takes transformers' local inference path with identical arithmetic; the DTensors
go back in `finally`. Only Linears whose weight is sharded on one dimension (Shard(0): column,
Shard(1): row) are touched; embeddings and anything else keep their DTensors. A forward inside must
run without gradients (generate's): with gradients the styles compute in DTensors, and a plain
parameter there fails loudly (torch refuses to mix Tensor and DTensor), it does not compute wrong.

The TP wrappers' own code is host cost too: traced, each wrapped Linear's forward (its parameters
listed, swapped and put back around every call) adds guards per layer, ~40% more than the same
step on one GPU (the guard log of a 4-layer TP2 step on the CPU, 2026-11-28). So inside, a linear of
the plain "colwise" style (replicated input, its shard of the output kept) runs nn.Linear's own
forward, and one of the plain "rowwise" style (its shard of the input, a replicated output) becomes an
instance of a subclass whose forward runs nn.Linear's product on its shard, then the all-reduce, then
the bias, as transformers' local inference path does (a class-level forward: a closure per module cost
guards on its cells every step); it finds its process group by name in this module's registry (the group
held by each module cost a guard per module). Its class and forward go back in `finally`. Any other
style (an lm_head that gathers its output) keeps its wrapper. A module under transformers'
ReplicatedWithGradAllReduce (Qwen3's q_norm / k_norm: replicated weights on this rank's heads) runs its
class's forward: without gradients the wrapper calls it and nothing else, while traced its closure cost
guards of its own (a TP2 step of 8 layers on the CPU: 2227 -> 2163 guards
for default kernels, the same logits, 2026-11-30). The wrappers go back in `finally`.

A vocab-parallel embedding (transformers' "embedding_rowwise": the vocabulary sharded on dim 0, the
ids replicated) gets its local shard and a forward that looks up the ids in this rank's slice, zeroes
the rows of ids outside it and all-reduces: the same sum of one lookup and zeros as its DTensor path
(exact in any order), without DTensor's sharding propagation, whose guard on the ids' batch (size < 2,
from its strategy enumeration) traced batch 1 apart from batch 2+ in every compiled TP step.
"""

import contextlib
import typing


def vocab_sharded_embeddings(model) -> list:
    """nn.Embedding modules whose weight is a DTensor sharded on the vocabulary (Shard(0)) alone; a subclass
    (Gemma's scaled embedding, say) keeps its own forward and so its wrapper and DTensor."""
    import torch

    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:
        return []
    return [m for m in model.modules() if type(m) is torch.nn.Embedding and isinstance(m.weight, DTensor)
            and len(m.weight.placements) == 1 and m.weight.placements[0] == Shard(0)]


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

    swapped, wrappers, registered = [], [], []
    try:
        # an embedding's wrapper looks its ids up in the DTensor's global vocabulary: its local shard only
        # goes in with our forward (a transformers whose style this does not mirror keeps both)
        embeddings = [m for m in vocab_sharded_embeddings(model)
                      if plain_forward(m, m.__dict__.get("forward"), m.weight) is not None]
        for module, name in shard_linears(model) + [(m, "weight") for m in embeddings]:
            original = module._parameters[name]
            module._parameters[name] = torch.nn.Parameter(original.to_local(), requires_grad=False)
            swapped.append((module, name, original))
        for module, _, original in swapped:
            wrapper = module.__dict__.get("forward")
            if wrapper is None or any(module is m for m, _, _ in wrappers):
                continue
            plain = plain_forward(module, wrapper, original)
            if plain is not None:
                wrappers.append((module, wrapper, type(module)))
                del module.forward  # the class's own forward (nn.Linear's, or the row-parallel subclass's)
                if isinstance(plain, _RowParallel):
                    module.nondet_tp_group_name = plain.group.group_name
                    if module.nondet_tp_group_name not in _GROUPS:  # a scope nested in another finds it there
                        _GROUPS[module.nondet_tp_group_name] = plain.group
                        registered.append(module.nondet_tp_group_name)
                    module.__class__ = row_parallel_class(type(module))
                elif plain is not _CLASS_FORWARD:
                    module.forward = plain
        for module in grad_only_wrapped(model):
            wrappers.append((module, module.__dict__["forward"], type(module)))
            del module.forward  # the class's own forward: the wrapper only hooks gradients
        yield len(swapped)
    finally:
        for module, wrapper, cls in wrappers:
            module.__class__ = cls
            module.__dict__.pop("nondet_tp_group_name", None)
            module.forward = wrapper
        for module, name, original in swapped:
            module._parameters[name] = original
        for name in registered:
            del _GROUPS[name]


_CLASS_FORWARD = object()  # plain_forward's answer for "the class's own forward"


def grad_only_wrapped(model) -> list:
    """Modules whose forward is transformers' ReplicatedWithGradAllReduce wrapper around the class's own forward
    (Qwen3's q_norm / k_norm under TP): without gradients it calls that forward and nothing else, so inside
    the class's forward runs. Traced, the wrapper's closure costs guards of its own on every step."""
    found = []
    for module in model.modules():
        wrapper = module.__dict__.get("forward")
        inner = _closure(wrapper, "original_forward")
        if (getattr(wrapper, "__qualname__", "").startswith("ReplicatedWithGradAllReduce.install_forward.")
                and getattr(wrapper, "__module__", None) == "transformers.distributed.tensor_parallel"
                and _closure(wrapper, "module") is module and getattr(inner, "__self__", None) is module
                and getattr(inner, "__func__", None) is type(module).forward):
            found.append(module)
    return found


def plain_forward(module, wrapper, sharded):
    """What replaces transformers' TP wrapper `wrapper` of a module holding local shards (`sharded`: its
    DTensor weight): _CLASS_FORWARD (colwise), _RowParallel (rowwise), a forward that all-reduces (a
    vocab-parallel embedding), or None (another style: the wrapper stays)."""
    style, mesh = _closure(wrapper, "self"), _closure(wrapper, "mesh")
    if style is None or mesh is None or type(style).__module__ != "transformers.distributed.tensor_parallel":
        return None  # not one of transformers' TP wrappers this mirrors: it stays
    from torch.distributed.tensor import Replicate, Shard

    name, local_output = type(style).__name__, getattr(style, "use_local_output", False)
    inputs, outputs = getattr(style, "input_layouts", None), getattr(style, "output_layouts", None)
    if name == "ColwiseParallel" and local_output and inputs == Replicate() and outputs in (Shard(-1),):
        return _CLASS_FORWARD
    if name == "RowwiseParallel" and local_output and inputs == Shard(-1) and outputs == Replicate():
        return _RowParallel(mesh.get_group() if mesh.ndim == 1 else mesh.get_group("tp"))
    if name == "EmbeddingParallel" and local_output and getattr(style, "shard_dim", None) == 0 and mesh.ndim == 1:
        return _vocab_parallel_forward(module, mesh.get_group(), _first_row(sharded, mesh))
    return None


def _first_row(weight, mesh) -> int:
    """The global vocabulary row where this rank's Shard(0) slice begins (torch.chunk's split: slices of
    ceil(V / W) rows, the last ones shorter or empty)."""
    rows, world = weight.shape[0], mesh.size()
    return min(mesh.get_local_rank() * -(-rows // world), rows)


def _vocab_parallel_forward(module, group, first: int):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    def forward(ids):
        rows = module.weight.shape[0]  # this rank's slice
        local = ids - first
        here = (local >= 0) & (local < rows)
        out = F.embedding(torch.where(here, local, 0), module.weight)  # padding_idx only shapes gradients
        out = torch.where(here.unsqueeze(-1), out, 0)  # other ranks' ids: a zero row here, their row there
        dist.all_reduce(out, group=group)  # one lookup and zeros: exact whatever adds them
        return out

    return forward


class _RowParallel(typing.NamedTuple):
    """plain_forward's answer for a row-parallel linear: the row-parallel subclass's forward, summing over `group`."""

    group: object


_ROW_PARALLEL_CLASSES: dict = {}  # Linear class -> its row-parallel subclass, made once per process
# process group name -> group, for the row-parallel forward: each module holds the name (a str: one cheap
# constant guard per module when traced), not the group, whose guard per module cost ~6 us of dynamo's check
# every compiled step on an H200 host (12 layers TP2: 561 -> 411 us without those guards, 2026-11-30)
_GROUPS: dict = {}


def row_parallel_class(base: type) -> type:
    """A subclass of `base` (an nn.Linear) whose forward is the row-parallel one: a class-level forward, since
    an instance-level closure costs dynamo guards on its cells and on the module every compiled step (per
    row-parallel linear ~14 more on an 8-layer TP2 step of an H200, 2026-11-30)."""
    if base not in _ROW_PARALLEL_CLASSES:
        _ROW_PARALLEL_CLASSES[base] = type(f"RowParallel{base.__name__}", (base,),
                                           {"forward": _row_parallel_forward, "__module__": __name__})
    return _ROW_PARALLEL_CLASSES[base]


def _row_parallel_forward(self, x):
    import torch.distributed as dist
    import torch.nn.functional as F

    out = F.linear(x, self.weight)  # this rank's partial product: its K shard
    # dist.all_reduce looked up at call time: the mode's collective when it is on
    dist.all_reduce(out, group=_GROUPS[self.nondet_tp_group_name])
    return out if self.bias is None else out + self.bias  # once, after the sum


def _closure(function, name: str):
    """The value of free variable `name` of `function` (a closure), or None."""
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None)
    if code is None or not cells or name not in code.co_freevars:
        return None
    return cells[code.co_freevars.index(name)].cell_contents
