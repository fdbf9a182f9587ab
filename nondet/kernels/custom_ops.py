"""The invariant kernels as PyTorch custom ops, so a traced graph (torch.compile) keeps them opaque.

The mode's aten overrides sit on the CPU / CUDA dispatch keys; torch.compile traces with fake
tensors, so its graph holds plain aten.mm / aten.mean / aten._softmax and Inductor lowers them with
its own reductions (extern mm calls go through `.out` overloads, which the overrides leave to the
original kernels). Under compile the mode's numerics must enter the graph as ops Inductor cannot
look into: these. Each runs the same function as nondet.kernels.ops (the same bits as eager under
the mode) and has a fake implementation for tracing. Registration happens on first use
(`ensure_registered`), never at import.

On CUDA the matmuls and the row reductions are registered a second time as
`torch.library.triton_op`s (name suffix `_gpu`, GPU_OPS): Inductor traces their bodies down to our Triton launches (launch.py) and calls
the kernels from its generated code, so a compiled step pays no Python call per op. The bodies
run the same kernels with the same arguments, so the same bits (checked on the device:
scripts/device/gpu_compile.py); only the persistent TMA matmul gets its tensors there instead of host
descriptors, and builds the descriptors itself (triton_matmul._device_desc). `op(name, *tensors)`
picks the one for the tensors at hand. The CPU and the Triton interpreter keep the opaque custom
ops: there a traced body would be plain aten ops that Inductor re-derives.
"""

import torch

from nondet.kernels import custom_grads

_REGISTERED = {}


def ensure_registered() -> None:
    """Define the nondet:: custom ops once (idempotent)."""
    if _REGISTERED:
        return
    from nondet.kernels import ops

    @torch.library.custom_op("nondet::mm", mutates_args=())
    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.mm(a, b)

    @mm.register_fake
    def _(a, b):
        return a.new_empty((a.shape[0], b.shape[1]))

    @torch.library.custom_op("nondet::addmm", mutates_args=())
    def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.addmm(bias, a, b)

    @addmm.register_fake
    def _(bias, a, b):
        return a.new_empty((a.shape[0], b.shape[1]))

    @torch.library.custom_op("nondet::layer_norm", mutates_args=())
    def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float) -> torch.Tensor:
        return ops.layer_norm(x, weight, bias, eps)

    @layer_norm.register_fake
    def _(x, weight, bias, eps):
        return x.new_empty(x.shape)

    @torch.library.custom_op("nondet::bmm", mutates_args=())
    def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.bmm(a, b)

    @bmm.register_fake
    def _(a, b):
        return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))

    @torch.library.custom_op("nondet::mean_last", mutates_args=())
    def mean_last(x: torch.Tensor, keepdim: bool) -> torch.Tensor:
        return ops.mean_last(x, keepdim)

    @mean_last.register_fake
    def _(x, keepdim):
        return x.new_empty((*x.shape[:-1], 1) if keepdim else x.shape[:-1])

    @torch.library.custom_op("nondet::mean_sq", mutates_args=())
    def mean_sq(x: torch.Tensor, keepdim: bool) -> torch.Tensor:
        return ops.mean_sq(x, keepdim)

    @mean_sq.register_fake
    def _(x, keepdim):
        return x.new_empty((*x.shape[:-1], 1) if keepdim else x.shape[:-1], dtype=torch.float32)

    @torch.library.custom_op("nondet::softmax", mutates_args=())
    def softmax(x: torch.Tensor, log: bool) -> torch.Tensor:
        return (ops.log_softmax if log else ops.softmax)(x)

    @softmax.register_fake
    def _(x, log):
        return x.new_empty(x.shape)

    @torch.library.custom_op("nondet::attention", mutates_args=())
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                  is_causal: bool, softcap: float | None, sinks: torch.Tensor | None,
                  sliding: bool) -> torch.Tensor:
        return ops.attention(q, k, v, mask, scale, is_causal, softcap=softcap, sinks=sinks, sliding=sliding)

    @attention.register_fake
    def _(q, k, v, mask, scale, is_causal, softcap, sinks, sliding):
        return q.new_empty((q.shape[0], q.shape[2], q.shape[1], v.shape[3]))

    @torch.library.custom_op("nondet::grouped_mm", mutates_args=())
    def grouped_mm_op(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor, stored_out_in: bool) -> torch.Tensor:
        return _grouped_mm(x, weight.transpose(1, 2) if stored_out_in else weight, counts)

    @grouped_mm_op.register_fake
    def _(x, weight, counts, stored_out_in):
        return x.new_empty((x.shape[0], weight.shape[1] if stored_out_in else weight.shape[2]))

    @torch.library.custom_op("nondet::rounded_add", mutates_args=())
    def rounded_add_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return rounded_add(a, b)

    @rounded_add_op.register_fake
    def _(a, b):
        return torch.empty_like(a)

    _REGISTERED.update(mm=mm, addmm=addmm, grouped_mm=grouped_mm_op, layer_norm=layer_norm, bmm=bmm, mean_last=mean_last,
                       mean_sq=mean_sq, softmax=softmax, attention=attention, rounded_add=rounded_add_op)
    _REGISTERED.update(_register_gpu_ops(ops))
    # the bare attention kernel and the grouped matmul have no backward: a training forward takes the
    # whole attention op and the experts' loop (grouped.applies)
    # (tp_tree's rounded_add is an inference-only op too)
    custom_grads.register({name: op for name, op in _REGISTERED.items()
                           if name not in ("attention_kernel", "grouped_mm", "rounded_add")})


# dtypes whose plain torch.add is an fp32 add rounded once: 16-bit floats are added in their opmath type,
# fp32, on CUDA and on the CPU (vectorized or not), then rounded to nearest even
ONE_ROUNDING_ADD_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def rounded_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One node of rounded_tree's pairwise tree: a + b in fp32, rounded once to a's dtype. Traced, it is the
    opaque nondet::rounded_add, so that Inductor cannot fuse two levels of the tree and drop the rounding
    between them (on an H200 a 4-leaf tree compiled gave other bits than eager; one level, the same).
    For 16-bit floats one torch.add gives those bits in one kernel, without the fp32 copies (4 kernels; on
    the CPU a (64, 4096) bf16 node 55 against 254 us; tests/test_rounded_tree.py checks the bits)."""
    if a.dtype == b.dtype and a.dtype in ONE_ROUNDING_ADD_DTYPES:
        return torch.add(a, b)
    return (a.float() + b.float()).to(a.dtype)


def _register_gpu_ops(ops) -> dict:
    """The `_gpu` triton_ops: the same bodies, traceable down to the kernel launches."""
    triton_op = torch.library.triton_op

    @triton_op("nondet::mm_gpu", mutates_args=())
    def mm_gpu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.mm(a, b)

    @triton_op("nondet::addmm_gpu", mutates_args=())
    def addmm_gpu(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.addmm(bias, a, b)

    @triton_op("nondet::bmm_gpu", mutates_args=())
    def bmm_gpu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.bmm(a, b)

    @triton_op("nondet::mean_last_gpu", mutates_args=())
    def mean_last_gpu(x: torch.Tensor, keepdim: bool) -> torch.Tensor:
        return ops.mean_last(x, keepdim)

    @triton_op("nondet::mean_sq_gpu", mutates_args=())
    def mean_sq_gpu(x: torch.Tensor, keepdim: bool) -> torch.Tensor:
        return ops.mean_sq(x, keepdim)

    @triton_op("nondet::softmax_gpu", mutates_args=())
    def softmax_gpu(x: torch.Tensor, log: bool) -> torch.Tensor:
        return (ops.log_softmax if log else ops.softmax)(x)

    # Attention's kernel stays opaque (not a triton_op: see GPU_OPS); what it needs from the mask
    # (ops.KeyRanges) is computed in the graph (ops.attention_inputs), where Inductor
    # fuses those small index ops instead of dispatching each from Python on every call.
    @torch.library.custom_op("nondet::attention_kernel", mutates_args=())
    def attention_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                         kv_start: torch.Tensor, query_start: torch.Tensor | None, query_end: torch.Tensor | None,
                         run_start: torch.Tensor | None, scale: float, softcap: float | None,
                         sinks: torch.Tensor | None) -> torch.Tensor:
        from nondet.kernels import triton_attention

        return triton_attention.attention(q, k, v, mask, scale, kv_start, softcap=softcap, sinks=sinks,
                                          query_start=query_start, query_end=query_end, run_start=run_start)

    @attention_kernel.register_fake
    def _(q, k, v, mask, kv_start, query_start, query_end, run_start, scale, softcap, sinks):
        return q.new_empty((q.shape[0], q.shape[2], q.shape[1], v.shape[3]))

    return dict(mm_gpu=mm_gpu, addmm_gpu=addmm_gpu, bmm_gpu=bmm_gpu, mean_last_gpu=mean_last_gpu,
                mean_sq_gpu=mean_sq_gpu, softmax_gpu=softmax_gpu, attention_kernel=attention_kernel)


# The ops whose Inductor-launched kernels were checked bitwise equal to the eager launch (H200,
# torch 2.11, triton 3.6; mean_sq: H100, 2026-11-26). layer_norm gave other bits under Inductor and
# attention did not compile there (Inductor specializes its arguments differently from the JIT): both
# stay opaque custom ops.
GPU_OPS = frozenset({"mm", "addmm", "bmm", "mean_last", "mean_sq", "softmax"})
# Row counts up to a decode batch keep the opaque op: a decode step runs as a CUDA graph, which
# replays it without host cost, and Inductor compiling our kernels per shape tripled the compile
# time of the 8B shape's decode (43 -> 137 s, H200). Above it (a prefill, not replayed as a graph
# by transformers) the launch from Inductor's code saves the Python call per op.
DECODE_ROWS = 128


def op(name: str, *tensors: torch.Tensor):
    """torch.ops.nondet.<name>, or its `_gpu` triton_op where there is one, the first tensor has more
    rows than a decode batch and the Triton kernels would run on these tensors (CUDA, a Triton
    dtype, operands of one dtype, not the interpreter)."""
    from nondet.kernels.launch import interpreting
    from nondet.kernels.ops import TRITON_DTYPES

    ensure_registered()
    first = tensors[0]
    rows = first.numel() // max(first.shape[-1], 1) if first.dim() else 1
    gpu = (name in GPU_OPS and _surely_more_than_decode(rows) and first.is_cuda and first.dtype in TRITON_DTYPES
           and not interpreting() and all(t.dtype == first.dtype for t in tensors[1:]))
    return getattr(torch.ops.nondet, f"{name}_gpu" if gpu else name)


def _surely_more_than_decode(rows) -> bool:
    """rows > DECODE_ROWS where that is known without a guard. Traced with a dynamic batch, rows is a
    symbol: asking would make dynamo guard on it (B * heads <= 128, ...) and compile the decode step
    again at every threshold the batch crosses (on an H200 batch sizes 2-4, 5-8, 9-16 and 17-128 were
    graphs of their own, where default kernels compile one for them all). Both ops give the same bits
    (GPU_OPS), so an unknown row count keeps the opaque op, the decode batch's choice."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(rows > DECODE_ROWS))


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor, stored_out_in: bool) -> torch.Tensor:
    """Rows x (R, K) sorted by expert, counts (E,) of them per expert, times their expert's weight:
    (E, N, K) when stored_out_in (nn.Linear's layout), else (E, K, N) -> (R, N). One opaque op in a
    traced graph (grouped.py)."""
    ensure_registered()
    return torch.ops.nondet.grouped_mm(x, weight, counts, stored_out_in)


def _grouped_mm(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """weight (E, K, N): the Triton grouped kernel where it runs (no host sync), else the invariant mm
    per expert's rows (reads the counts on the host: an opaque op's body, never a graph's)."""
    from nondet.kernels import ops
    from nondet.kernels.launch import interpreting

    if ops._triton(x) and x.dtype == weight.dtype and not interpreting():
        from nondet.kernels import triton_grouped

        return triton_grouped.grouped_mm(x, weight, counts)
    out = x.new_zeros((x.shape[0], weight.shape[2]))
    start = 0
    for expert, rows in enumerate(counts.tolist()):
        if rows:
            out[start:start + rows] = ops.mm(x[start:start + rows], weight[expert])
            start += rows
    return out


def attention(q, k, v, mask, scale: float, is_causal: bool, softcap, sinks, sliding: bool) -> torch.Tensor:
    """ops.attention for a graph being traced: on the Triton path its mask arithmetic in the graph
    and the kernel as nondet::attention_kernel; elsewhere the opaque nondet::attention."""
    from nondet.kernels import ops
    from nondet.kernels.launch import interpreting

    ensure_registered()
    # A training forward takes the whole op, which has a backward (custom_grads); the bare kernel has none.
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks))
    if grads or not (ops._triton(q) and not interpreting()):
        return torch.ops.nondet.attention(q, k, v, mask, scale, is_causal, softcap, sinks, sliding)
    keys = ops.attention_inputs(q, k, mask, is_causal, sliding)
    return torch.ops.nondet.attention_kernel(q, k, v, keys.mask, keys.kv_start, keys.query_start, keys.query_end,
                                             keys.run_start, scale, softcap, sinks)
