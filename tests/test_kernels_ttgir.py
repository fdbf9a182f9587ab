"""The attention kernel's compiled IR, checked on the CPU: no sum whose order a compiler pass can move.

A row's softmax denominator used to be `tl.sum(p, axis=1)`, whose order follows the layout
Triton gives p, and that layout depended on the binary: with a mask to load, p was summed in
a blocked layout, without one in the MMA layout (Triton 3.6 on an H100, and Triton 3.9 here),
so a speculative verification chunk (masked) and a one-token decode (causal) differed by
1 ULP in 2-3 of 30 shapes (docs/benchmarks.md). The kernel now sums with a dot. This
test compiles the kernel for Hopper and Ampere without a GPU (Triton ships ptxas) for every
mask kind and asserts every reduction left over a row is a max (exact in any order).
"""

import os
import re

import pytest
from interpreter import rerun_compiling_for_gpus

INNER = os.environ.get("NONDET_TTGIR_INNER") == "1"
MASK_KINDS = (0, 1, 2)  # causal (no mask), bool mask, additive mask


if not INNER:

    def test_attention_ir_has_no_layout_dependent_sum(tmp_path):
        rerun_compiling_for_gpus(__file__, "NONDET_TTGIR_INNER", tmp_path)

    def test_row_kernels_get_rows_in_one_aligned_dense_form():
        """The row kernels' launchers pass every input as dense, 16-byte aligned rows, so one
        binary (one vector width, one summation order) serves every call of a row length."""
        import torch

        from nondet.kernels.triton_rows import _rows

        base = torch.randn(4 * 64 + 1, dtype=torch.bfloat16)
        cases = {
            "contiguous": base[:256].view(4, 64),
            "misaligned": base[1:].view(4, 64),  # 2 bytes past an aligned address
            "strided rows": torch.randn(4, 128, dtype=torch.bfloat16)[:, :64],
            "last token of a sequence": torch.randn(1, 7, 64, dtype=torch.bfloat16)[:, -1:],
        }
        for name, x in cases.items():
            rows = _rows(x)
            assert rows.shape == (x.numel() // 64, 64) and torch.equal(rows, x.reshape(-1, 64)), name
            assert rows.stride() == (64, 1) and rows.data_ptr() % 16 == 0, name
        # no copy where none is needed (the common case costs nothing)
        assert _rows(cases["contiguous"]).data_ptr() == cases["contiguous"].data_ptr()
        last = cases["last token of a sequence"]
        assert _rows(last).data_ptr() == last.data_ptr()

else:
    import collections
    import functools

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from nondet.kernels import triton_attention as ta
    from nondet.kernels.masks import KERNEL_MASK_DTYPE

    MASK_TYPES = {torch.int16: "*i16", torch.int32: "*i32", torch.uint8: "*u8", torch.bool: "*i1"}
    INTS = ("Q", "S", "H", "KVH", "D", "DV", "NC", "s_qb", "s_qh", "s_qq", "s_qd", "s_kb", "s_kh", "s_ks", "s_kd",
            "s_vb", "s_vh", "s_vs", "s_vd", "s_mb", "s_mq", "s_ms")

    def _ttgir(mask_kind: int, arch: int, runs: bool = False) -> str:
        """TTGIR of _attn_kernel as the launcher compiles it for bf16 decode/prefill tiles."""
        return _asm(mask_kind, arch, runs)["ttgir"]

    @functools.cache
    def _asm(mask_kind: int, arch: int, runs: bool = False) -> dict:
        """Every stage's text of _attn_kernel compiled for bf16 decode/prefill tiles; runs: the mask's rows
        also given as runs (ops.run_start), as every mask from ops.attention is: two chunk loops in one
        binary, by position and by the mask."""
        const = dict(G=2, BLOCK_M=16, BLOCK_N=128, BLOCK_D=64, BLOCK_DV=64, CHUNK=512, SPLIT=False,
                     CAUSAL=mask_kind == 0, MASK_KIND=mask_kind, PRECISION="tf32", UPCAST=False, SOFTCAP=False,
                     SINKS=False, ONE_QUERY=False, HAS_END=mask_kind != 0, HAS_RUNS=runs, MERGE_BLOCK=4)
        sig = {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "ws_m", "ws_l", "ws_acc", "sink_ptr")}
        sig.update(count_ptr="*i32", mask_ptr=MASK_TYPES[KERNEL_MASK_DTYPE] if mask_kind == 1 else "*bf16", start_ptr="*i32",
                   end_ptr="*i32", run_ptr="*i32", qk_scale="fp32", cap_in="fp32", cap_out="fp32")
        sig.update({name: "i32" for name in INTS})
        sig.update({name: "constexpr" for name in const})
        names = ta._attn_kernel.arg_names
        src = ASTSource(ta._attn_kernel, sig, constexprs={(names.index(k),): v for k, v in const.items()})
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4, "num_stages": 2})
        return dict(kernel.asm)

    def _row_reductions(ttgir: str) -> list[str]:
        """The combining op of every tt.reduce (e.g. arith.maxnumf, arith.addf)."""
        return re.findall(r'"tt\.reduce"\([^)]*\)[^\n]*\n[^\n]*\n\s*%\S+ = (\w+\.\w+)', ttgir)

    BINARIES = [(kind, False) for kind in MASK_KINDS] + [(1, True), (2, True)]  # (mask kind, runs)

    @pytest.mark.parametrize("arch", [90, 80])
    @pytest.mark.parametrize("mask_kind,runs", BINARIES)
    def test_every_row_reduction_is_a_max(mask_kind, runs, arch):
        ops = _row_reductions(_ttgir(mask_kind, arch, runs))
        assert ops, "no reduction found: the IR pattern no longer matches"
        # float maxima over rows; with a mask also an integer max (the tile's last visible position) and,
        # with runs, an integer min (whether every row of the tile is a run)
        allowed = {"arith.maxnumf", "arith.maxsi"} | ({"arith.minsi"} if runs else set())
        assert "arith.maxnumf" in ops and set(ops) <= allowed, ops

    def _dot_operand_layouts(ttgir: str) -> list[str]:
        """Each tt.dot's operand types, layouts included (kWidth sets the K order inside the MMA)."""
        return [m.group(1) for m in re.finditer(r"tt\.dot [^:]*: (.*?) -> ", ttgir)]

    @pytest.mark.parametrize("arch", [90, 80])
    def test_every_mask_kind_feeds_the_dots_the_same_layouts(arch):
        """A bool mask loaded as bytes gave the p operand kWidth 4 (causal: 2), so a masked call
        summed p @ V in another K order: the H100's 1-ULP differences. The launcher's mask dtype
        must keep every binary's dot layouts those of the causal one."""
        causal = _dot_operand_layouts(_ttgir(0, arch))
        assert len(causal) == 3
        for mask_kind, runs in BINARIES[1:]:  # with runs: the loop by position, then the loop by the mask
            assert _dot_operand_layouts(_ttgir(mask_kind, arch, runs)) == causal * (2 if runs else 1), mask_kind

    FLOAT_OPS = (r"\b(mma\.sync[.\w]*|wgmma[.\w]*|ex2[.\w]*|fma[.\w]*|mul[.\w]*f32|sub[.\w]*f32|add[.\w]*f32"
                 r"|div[.\w]*f32|max[.\w]*f32|cvt[.\w]*bf16[.\w]*)")

    @pytest.mark.parametrize("arch", [90, 80])
    def test_a_bool_mask_costs_no_arithmetic_the_causal_binary_does_not_do(arch):
        """The PTX of the bool-mask binary has the causal binary's float instructions, kind by kind:
        the mask only decides which scores become -inf."""
        def profile(kind):
            return collections.Counter(re.findall(FLOAT_OPS, _asm(kind, arch)["ptx"]))

        assert profile(1) == profile(0)

    def test_the_row_sum_is_a_dot():
        # the row sum is the third dot (q.k, p.ones, p.v) in every binary
        for mask_kind, runs in BINARIES:
            ttgir = _ttgir(mask_kind, 90, runs)
            dots = len(re.findall(r"\b(tt\.dot|ttng\.warp_group_dot)\b", ttgir))
            assert dots == (6 if runs else 3), (mask_kind, runs)
