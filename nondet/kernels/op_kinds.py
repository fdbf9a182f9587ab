"""Which aten ops cannot make one row's numbers depend on the batch: the census's reviewed allowlist.

The census (census.py) sorts every aten op a model runs into routed (the mode's kernel computes it),
row-independent (this file), or uncovered. An op belongs here only when the bits of one row's
results cannot depend on how many rows share the call:

- VIEWS_AND_COPIES: metadata, allocation, copies, casts. No arithmetic.
- ELEMENTWISE: one output element from the elements at the same index. Rounded the same way at
  every index on GPUs; on a CPU a vectorized loop's body and its scalar tail may compute a
  transcendental differently, which tests/test_elementwise_position.py measures on each
  instruction set (the census cannot see that; the test on both instruction sets must).
- INDEXING: gathers, scatters without accumulation, concatenation, padding. Moves values.
- EXACT: reductions whose result does not depend on the order of accumulation (max, min, argmax,
  comparisons, counts) and any reduction over integers or booleans.

Not here, on purpose: every float sum, mean, product, matmul, convolution, cumulative op, norm,
softmax, attention and accumulating scatter (index_add, scatter_add, index_put with accumulate,
scatter with a reduce, bincount with float weights): they add in an order a kernel chooses, and that
choice may follow the batch. The mode must route them (overrides.py) or the census refuses the model.
"""

VIEWS_AND_COPIES = frozenset("""
    view _unsafe_view reshape expand expand_as permute transpose t unsqueeze squeeze slice select alias
    as_strided split split_with_sizes unbind chunk narrow contiguous clone copy_ _to_copy to detach detach_
    lift_fresh lift_fresh_copy empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like
    new_zeros ones ones_like new_ones full full_like new_full arange scalar_tensor fill_ fill zero_ _local_scalar_dense
    _assert_async _assert_tensor_metadata sym_size sym_stride sym_numel is_nonzero item resize_ set_
    unfold movedim view_as diagonal real view_as_real view_as_complex
    """.split())

ELEMENTWISE = frozenset("""
    add add_ sub sub_ rsub mul mul_ div div_ neg neg_ pow pow_ rsqrt sqrt exp exp2 expm1 log log1p log2
    sigmoid sigmoid_ silu silu_ gelu gelu_ tanh tanh_ erf relu relu_ softplus cos sin clamp clamp_
    clamp_min clamp_max where masked_fill masked_fill_ eq ne lt le gt ge bitwise_not bitwise_and
    bitwise_or bitwise_xor logical_not logical_and logical_or abs maximum minimum reciprocal nan_to_num
    nan_to_num_ floor ceil round trunc sign lerp addcmul addcdiv remainder fmod floor_divide isnan
    isinf isfinite hardtanh leaky_relu elu mish hardswish hardsigmoid sgn square atan atan2 sinh cosh
    """.split())
# not _softmax_backward_data: grad * y - y * sum(grad * y) over the softmax's dim, a row sum (it was
# listed here; the census's forward never meets it, our own backward runs it inside our kernel)

INDEXING = frozenset("""
    embedding index index_select gather scatter scatter_ index_put index_put_ index_fill index_fill_
    masked_scatter cat stack constant_pad_nd pad repeat repeat_interleave roll flip tril triu tril_
    triu_ one_hot masked_select take
    """.split())

EXACT = frozenset("""
    max min amax amin argmax argmin any all nonzero bincount sort argsort unique _unique2 isin
    count_nonzero searchsorted equal
    """.split())

# accumulating forms of ops that are otherwise plain moves of values
_ACCUMULATING = {"index_put": 3, "index_put_": 3}  # op -> position of `accumulate` in its schema
_REDUCING = {"scatter", "scatter_"}  # .reduce / .value_reduce overloads: reduce="add" / "multiply"
# add / sub with alpha != 1 in bf16 on a CPU: the element's bits follow its position in the call
# (tests/test_elementwise_position.py measures it on AVX-512 and AVX2); the mode has no kernel for them
_FUSED_ALPHA = {"add", "add_", "sub", "sub_", "rsub"}


def base_name(func) -> str:
    """aten.mul.Tensor -> 'mul'."""
    return func._schema.name.split("::")[-1]


def row_independent(func, args, kwargs) -> str | None:
    """The allowlist's name for this call ('elementwise', 'view', ...), or None if it is not on it."""
    name = base_name(func)
    if name in _ACCUMULATING and _accumulates(name, args, kwargs):
        return None
    if name in _REDUCING and kwargs.get("reduce") is not None:
        return None
    if name == "bincount" and _float_weights(args, kwargs):
        return None  # a weighted histogram adds float weights, in the order of the input
    if name in _FUSED_ALPHA and _alpha_in_bf16_on_a_cpu(args, kwargs):
        return None  # the vector body fuses x + alpha * y, the scalar tail does not (cpu.POSITION_DEPENDENT)
    for kind, names in (("view or copy", VIEWS_AND_COPIES), ("elementwise", ELEMENTWISE),
                        ("indexing", INDEXING), ("exact reduction", EXACT)):
        if name in names:
            return kind
    if integral_only(args, kwargs):
        return "integer arithmetic"  # sums of integers or booleans are exact in any order
    return None


def _alpha_in_bf16_on_a_cpu(args, kwargs) -> bool:
    import torch

    alpha = kwargs.get("alpha", 1)
    tensors = [a for a in _flat(args) if isinstance(a, torch.Tensor)]
    return (alpha != 1 and any(t.dtype == torch.bfloat16 for t in tensors)
            and all(t.device.type == "cpu" for t in tensors))


def _accumulates(name: str, args, kwargs) -> bool:
    position = _ACCUMULATING[name]
    flag = kwargs.get("accumulate", args[position] if len(args) > position else False)
    return bool(flag)


def _float_weights(args, kwargs) -> bool:
    weights = kwargs.get("weights", args[1] if len(args) > 1 else None)
    return weights is not None and weights.is_floating_point()


def integral_only(args, kwargs) -> bool:
    """Every tensor argument integer or boolean, and no floating dtype asked for: any sum of them is exact."""
    import torch

    tensors = [a for a in _flat(args) + _flat(list(kwargs.values())) if isinstance(a, torch.Tensor)]
    dtype = kwargs.get("dtype")
    if dtype is not None and (dtype.is_floating_point or dtype.is_complex):
        return False
    return bool(tensors) and not any(t.is_floating_point() or t.is_complex() for t in tensors)


def _flat(values) -> list:
    out = []
    for value in values:
        out.extend(_flat(value) if isinstance(value, (list, tuple)) else [value])
    return out
