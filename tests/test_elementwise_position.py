"""Does an elementwise op's result depend on where the element sits in the tensor? Measured on this host.

aten's CPU elementwise loop runs its vectorized body over whole steps of two vectors from the start of
the (coalesced) tensor and the remainder, the tail, with the scalar function; a thread pool splits a
call above 32768 elements into chunks, each with its own body and tail. Where the two functions round
differently an element's bits follow its position and the call's length, and a row's position and the
call's length follow the batch. Measured here: x[off:off + n] computed alone vs inside a 512-element
tensor, n = 1..70, offsets not multiples of 16, one thread. Torch 2.13, Intel Xeon with AVX-512
(x: position-dependent; 1: only a call of one element; exp, tanh, erf, log, sqrt, div, add, addcmul,
lerp and addcdiv are not, on any of the three):

    op                          AVX-512        AVX2           default
                                fp32  bf16     fp32  bf16     fp32  bf16
    sigmoid, silu, softplus      x     .        x     .        .     .
    exp2, mish, elu, sinh,       x     .        x     .        .     .
      cosh, atan2
    pow (x ** 1.7)               x     .        x     .        x     .
    pow (x ** y)                 x     .        x     .        .     .
    gelu (tanh)                  x     x        x     x        .     .
    gelu (erf)                   1     1        1     1        1     1
    rsqrt                        .     x        .     x        .     .
    add, sub with alpha=1.3      .     x        .     x        .     .

The body steps 32 fp32 and 32 or 64 bf16 elements on AVX-512, 16 fp32 on AVX2 and the default build:
a whole number of 64-element blocks (cpu.CPU_VECTOR_BLOCK) is all body on each. What the mode relies
on, asserted below on this process's instruction set (and, in a subprocess each, on
ATEN_CPU_CAPABILITY=default and avx2):

- an op outside cpu.POSITION_DEPENDENT gives an element the same bits wherever it sits (the census
  counts elementwise ops as row-independent: op_kinds.ELEMENTWISE);
- rows that are a whole number of cpu.CPU_VECTOR_BLOCKs are row-independent, on one thread;
- cpu.pointwise (the mode's path for POSITION_DEPENDENT ops: routers, experts) is position-independent,
  also on 4 threads, and gives every element the vector body's bits.

An op of POSITION_DEPENDENT that does not depend on its position on this instruction set is skipped with
the reason (a fact of the instruction set, the dtype or the arguments, not of the op).
"""

import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import torch

from nondet.kernels import cpu

aten = torch.ops.aten
LONG = 512  # the longer tensor x[:n] is compared inside; a whole number of blocks, so all body
LENGTHS = range(1, 71)
OFFSETS = (0, 1, 3, 5, 7, 13, 17, 31, 33, 47, 63)  # where x[:n] sits inside it; none a multiple of 16 but 0


@dataclass(frozen=True)
class Op:
    name: str
    func: object  # the functional aten overload (what cpu.pointwise takes)
    inputs: int = 1  # tensor inputs, each a slice of its own base tensor
    positive: bool = False  # inputs made positive (log, sqrt, rsqrt, pow's base)
    scalars: tuple = ()  # positional arguments after the tensors
    kwargs: dict = field(default_factory=dict)

    def args(self, tensors):
        return (*tensors, *self.scalars)


OPS = [
    Op("exp", aten.exp.default), Op("sigmoid", aten.sigmoid.default), Op("silu", aten.silu.default),
    Op("gelu", aten.gelu.default), Op("gelu-tanh", aten.gelu.default, kwargs={"approximate": "tanh"}),
    Op("tanh", aten.tanh.default), Op("erf", aten.erf.default), Op("softplus", aten.softplus.default),
    Op("log", aten.log.default, positive=True), Op("pow", aten.pow.Tensor_Scalar, positive=True, scalars=(1.7,)),
    Op("pow-tensor", aten.pow.Tensor_Tensor, inputs=2, positive=True),
    Op("rsqrt", aten.rsqrt.default, positive=True), Op("sqrt", aten.sqrt.default, positive=True),
    Op("div", aten.div.Tensor, inputs=2), Op("add", aten.add.Tensor, inputs=2),
    Op("add-alpha", aten.add.Tensor, inputs=2, kwargs={"alpha": 1.3}),
    Op("sub-alpha", aten.sub.Tensor, inputs=2, kwargs={"alpha": 1.3}),
    Op("addcmul", aten.addcmul.default, inputs=3, kwargs={"value": 1.3}),
    Op("lerp", aten.lerp.Scalar, inputs=2, scalars=(0.3,)), Op("addcdiv", aten.addcdiv.default, inputs=3),
    Op("atan2", aten.atan2.default, inputs=2), Op("exp2", aten.exp2.default), Op("mish", aten.mish.default),
    Op("elu", aten.elu.default), Op("sinh", aten.sinh.default), Op("cosh", aten.cosh.default),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _bases(op: Op, dtype, length: int = LONG, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    bases = [torch.randn(length, generator=g) * 3 for _ in range(op.inputs)]
    if op.positive:
        bases[0] = bases[0].abs() + 0.1
    if op.name == "addcdiv":
        bases[2] = bases[2].abs() + 1  # the divisor away from zero
    return [b.to(dtype) for b in bases]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def _misplaced(op: Op, dtype, compute) -> list[tuple[int, int]]:
    """(n, offset) where compute(x[offset:offset + n]) differs from compute(x)[offset:offset + n]."""
    bases = _bases(op, dtype)
    inside = compute(op.func, *op.args(bases), **op.kwargs)
    found = []
    for n in LENGTHS:
        for off in OFFSETS:
            alone = compute(op.func, *op.args([b[off:off + n].clone() for b in bases]), **op.kwargs)
            if not _same(alone, inside[off:off + n]):
                found.append((n, off))
    return found


def _native(func, *args, **kwargs):
    return func(*args, **kwargs)


def _capability() -> str:
    return torch.backends.cpu.get_cpu_capability()


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_only_the_ops_the_mode_pads_depend_on_their_position(op, dtype):
    misplaced = _misplaced(op, dtype, _native)
    base = op.func.overloadpacket.__name__
    if base in cpu.POSITION_DEPENDENT and not misplaced:
        pytest.skip(f"{op.name} {dtype}: position-independent on {_capability()}; cpu.POSITION_DEPENDENT pads "
                    f"{base} for another instruction set, dtype or argument")
    assert not misplaced or base in cpu.POSITION_DEPENDENT, (
        f"{op.name} {dtype} on {_capability()}: x[:n] alone differs from x[:n] inside a longer tensor at "
        f"(n, offset) {misplaced[:6]}: add {base!r} to cpu.POSITION_DEPENDENT")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_rows_of_whole_vector_blocks_are_row_independent(op, dtype):
    """(R, L) with L a whole number of CPU_VECTOR_BLOCKs: row r of the call equals the row computed alone."""
    width = 3 * cpu.CPU_VECTOR_BLOCK
    bases = [b.reshape(8, width) for b in _bases(op, dtype, 8 * width)]
    batched = op.func(*op.args(bases), **op.kwargs)
    for rows in range(1, 9):
        for r in range(rows):
            alone = op.func(*op.args([b[r:r + 1].clone() for b in bases]), **op.kwargs)
            assert _same(alone[0], batched[r]), f"{op.name} {dtype}: row {r} of {rows} differs from the row alone"


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_pointwise_is_position_independent_and_gives_the_vector_body(op, dtype):
    assert _misplaced(op, dtype, cpu.pointwise) == []
    bases = _bases(op, dtype)
    body = op.func(*op.args(bases), **op.kwargs)  # LONG is whole blocks: every element in the body
    assert _same(cpu.pointwise(op.func, *op.args(bases), **op.kwargs), body)


def test_threads_split_a_call_mid_vector_and_pointwise_does_not():
    """Above aten's grain size a call is cut into one chunk per thread, each with its own scalar tail:
    200000 elements on 4 threads put chunk boundaries at 50000k, not multiples of 32. cpu.pointwise cuts
    its own chunks below the grain size, so its bits do not follow the thread count."""
    x = torch.randn(200000, generator=torch.Generator().manual_seed(0)) * 3
    one = aten.silu.default(x)
    one_padded = cpu.pointwise(aten.silu.default, x)
    torch.set_num_threads(4)
    assert torch.equal(cpu.pointwise(aten.silu.default, x), one_padded)
    if torch.equal(aten.silu.default(x), one):
        pytest.skip(f"silu on 4 threads gave the 1-thread bits on {_capability()} (its body and tail agree here)")


def test_whole_vectors_sends_only_the_position_dependent_cpu_ops_to_pointwise():
    """cpu.whole_vectors (the routers' and experts' context): silu, in place too, through pointwise; exp
    (not position-dependent) and integer ops untouched."""
    x = torch.randn(40, generator=torch.Generator().manual_seed(1)) * 3
    with cpu.whole_vectors(x):
        silu = torch.nn.functional.silu(x)
        in_place = torch.nn.functional.silu(x.clone(), inplace=True)
        sigmoid = x.sigmoid()
        ints = torch.arange(5).pow(2)
    assert torch.equal(silu, cpu.pointwise(aten.silu.default, x)) and torch.equal(in_place, silu)
    assert torch.equal(sigmoid, cpu.pointwise(aten.sigmoid.default, x))
    assert torch.equal(ints, torch.tensor([0, 1, 4, 9, 16]))
    assert cpu.takes(aten.silu.default, (x,)) and not cpu.takes(aten.exp.default, (x,))


OTHER_CAPABILITIES = [c for c in ("default", "avx2") if c.upper() != _capability()
                      and (c == "default" or _capability() in ("AVX2", "AVX512"))]


@pytest.fixture(scope="module")
def other_runs():
    """This module's tests in a process per other instruction set (ATEN_CPU_CAPABILITY is read at torch's
    import), all started at once -> {capability: Popen}."""
    started = {c: subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                                    "not another_instruction_set"], env={**os.environ, "ATEN_CPU_CAPABILITY": c},
                                   cwd=os.path.dirname(os.path.abspath(__file__)), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
               for c in OTHER_CAPABILITIES}
    yield started
    for process in started.values():
        process.kill()
        process.wait()


@pytest.mark.parametrize("capability", OTHER_CAPABILITIES)
def test_the_same_facts_on_another_instruction_set(capability, other_runs):
    out, _ = other_runs[capability].communicate(timeout=300)
    assert other_runs[capability].returncode == 0, out[-3000:]
