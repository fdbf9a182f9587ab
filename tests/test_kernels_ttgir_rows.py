"""mean_sq's compiled IR, checked on the CPU: it sums a row's squares in the layout mean_last sums
a row of stored fp32 squares in, for bf16 and fp16 rows (the kernel's inputs) and fp32 rows.

The eager mode computes an RMSNorm's mean as aten's pow (fp32 squares written to memory) and then
_mean_kernel over them; the compiled mode reads the norm's bf16 input and squares it in the kernel
(ops.mean_sq). A row's sum order is the layout of the reduced tensor: elements per thread, threads,
warps. A bf16 row loads 8 elements per thread (16 bytes), fp32 rows 4, so without the kernel's
VECTOR cap the two would sum in different trees. Compiled here for Hopper and Ampere without a GPU.
"""

import os
import re

import pytest
from interpreter import rerun_compiling_for_gpus

INNER = os.environ.get("NONDET_TTGIR_ROWS_INNER") == "1"

if not INNER:

    def test_mean_sq_ir_sums_in_mean_lasts_layout(tmp_path):
        rerun_compiling_for_gpus(__file__, "NONDET_TTGIR_ROWS_INNER", tmp_path)

else:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from nondet.kernels import triton_rows

    # (row length, whether the launcher's N and row stride are multiples of 16): the widths of q / k
    # norms and hidden sizes, a length no vector divides, and ROW_BLOCK_MAX
    ROWS = [(64, True), (128, True), (256, True), (1024, True), (2880, True), (4096, True), (5120, True), (8192, True),
            (100, False)]

    def _reduced_layout(kernel, x_type: str, n: int, divisible: bool, arch: int, **const) -> str:
        """The layout of the tensor the kernel's one row reduction sums, as the launcher compiles it."""
        block, warps = triton_rows._block(n)
        const = dict(BLOCK=block, **const)
        sig = {"x_ptr": x_type, "y_ptr": "*fp32", "N": "i32", "s_x": "i32", **{k: "constexpr" for k in const}}
        names = kernel.arg_names
        aligned = ["x_ptr", "y_ptr"] + (["N", "s_x"] if divisible else [])
        src = ASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in const.items()},
                        attrs={(names.index(k),): [["tt.divisibility", 16]] for k in aligned})
        ttgir = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps}).asm["ttgir"]
        reduced = re.findall(r'"tt\.reduce"\(%\S+\)[^\n]*\n(?:[^\n]*\n)*?[^\n]*\}\) : \(tensor<\d+xf32, (#\w+)>', ttgir)
        assert len(reduced) == 1, ttgir[-3000:]
        layouts = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, re.M))
        return layouts[reduced[0]]

    @pytest.mark.parametrize("arch", [90, 80])
    @pytest.mark.parametrize("n,divisible", ROWS)
    def test_mean_sq_sums_every_dtype_in_the_fp32_rows_layout(n, divisible, arch):
        fp32_rows = _reduced_layout(triton_rows._mean_kernel, "*fp32", n, divisible, arch)
        assert "sizePerThread" in fp32_rows
        for x_type in ("*bf16", "*fp16", "*fp32"):
            got = _reduced_layout(triton_rows._mean_sq_kernel, x_type, n, divisible, arch,
                                  VECTOR=triton_rows.FP32_VECTOR)
            assert got == fp32_rows, (x_type, got, fp32_rows)

    @pytest.mark.parametrize("arch", [90, 80])
    def test_without_the_cap_a_bf16_row_sums_in_another_layout(arch):
        """The control: capped at a bf16 vector (8) instead, the layout differs, so the test above can fail."""
        fp32_rows = _reduced_layout(triton_rows._mean_kernel, "*fp32", 4096, True, arch)
        assert _reduced_layout(triton_rows._mean_sq_kernel, "*bf16", 4096, True, arch, VECTOR=8) != fp32_rows
