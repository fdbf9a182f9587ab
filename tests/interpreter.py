"""Running a test file's Triton checks under TRITON_INTERPRET=1 on the CPU, or compiling for a GPU
target without one (`rerun_compiling_for_gpus`: Triton ships ptxas).

TRITON_INTERPRET must be set before triton is first imported, which another test may already have
done in this process, so a file re-runs itself in a fresh interpreter with the variable set
(`rerun_under_interpreter`); its checks are collected only there. `prepare_interpreter` makes the
interpreter's tl.dot compute each row from that row alone, as a GPU's MMA does, and stops it patching
triton.language again on every call of a @triton.jit helper.
"""

import os
import subprocess
import sys


def rerun_under_interpreter(path: str, inner_flag: str) -> None:
    """Run the test file `path` in a fresh pytest with TRITON_INTERPRET=1 and `inner_flag`=1; assert it passed."""
    env = {**os.environ, "TRITON_INTERPRET": "1", inner_flag: "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", path],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


def rerun_compiling_for_gpus(path: str, inner_flag: str, cache_dir) -> None:
    """Run the test file `path` in a fresh pytest with `inner_flag`=1 and without TRITON_INTERPRET
    (inherited from another test file, it would stop Triton compiling for a GPU target); assert it passed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({inner_flag: "1", "TRITON_CACHE_DIR": str(cache_dir), "TRITON_DEFAULT_FP_FUSION": "1"})
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", path],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


def prepare_interpreter() -> None:
    """What every file run under the interpreter calls first: MMA-like rows, the language patched once, and
    no int32 overflow checks."""
    emulate_mma_rows()
    patch_language_once()
    skip_overflow_checks()


def skip_overflow_checks() -> None:
    """The interpreter checks every int32 add, sub and mul of a kernel for overflow (sanitize_overflow: a cast
    of both sides to int64, the op again, two compares and an assert each), 35% of the split-attention
    tests' time (triton 3.9, a 2-core AVX2 host). A compiled kernel has no such check unless built in
    debug, and these tests' shapes are far from 2**31 elements, so the check cannot fire in them; bits do
    not change. NONDET_TEST_OVERFLOW_CHECKS=1 keeps it (kernel indexing work)."""
    import dataclasses

    import triton.runtime.interpreter as interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if os.environ.get("NONDET_TEST_OVERFLOW_CHECKS") == "1" or not hasattr(options, "sanitize_overflow"):
        return
    builder.options = dataclasses.replace(options, sanitize_overflow=False)


def emulate_mma_rows() -> None:
    """tl.dot one row at a time. The interpreter's np.matmul goes to the host's BLAS, whose sgemm can
    round a row differently depending on the tile's OTHER rows (seen with numpy 2.4.6 on an AMD EPYC:
    a decode row of attention differed by 1 ULP from the same row in a prefill tile). A GPU's MMA
    computes each row from that row alone; so must the emulation, or bitwise tests would test the
    host's BLAS instead of our kernels."""
    import numpy as np
    import triton.runtime.interpreter as interpreter

    def dot_row_by_row(self, a, b, d, input_precision, max_num_imprecise_acc):
        b_data = np.ascontiguousarray(b.data)  # a transposed operand (b.T) must not change the order either
        rows = [np.matmul(a.data[i:i + 1], b_data, dtype=d.data.dtype) for i in range(a.data.shape[0])]
        return interpreter.TensorHandle(np.concatenate(rows) + d.data, d.dtype.scalar)

    interpreter.InterpreterBuilder.create_dot = dot_row_by_row


def patch_language_once() -> None:
    """The interpreter patches triton.language when a launch starts and again on every call of a
    @triton.jit helper inside it (`inspect.getmembers` over the whole module each time: 1.4 ms a call,
    28% of the split-attention tests' time, triton 3.9). A helper whose language modules the launch has
    already patched skips it: the patch would set what is already set. Bits do not change: the same
    patched functions run either way. Where the interpreter's internals are not as expected, nothing
    is changed."""
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    real = getattr(interpreter, "_patch_lang", None)
    scope_class = getattr(interpreter, "_LangPatchScope", None)
    if real is None or scope_class is None or getattr(real, "nondet_patched_once", False):
        return
    patched: set[int] = set()  # ids of the language modules the running launch patched

    def languages(fn) -> set[int]:
        return {id(value) for value in fn.__globals__.values() if value is tl or value is tl.core}

    def patch_once(fn):
        mine = languages(fn)
        if patched and mine <= patched:
            return scope_class()  # inside a launch that patched them: nothing to set, nothing to restore
        scope = real(fn)
        if patched:  # a helper seeing another language module (triton.language.standard sees core): the
            patched.update(mine)  # interpreter never restores a helper's patch, so it holds from here on
            return scope
        patched.update(mine)
        restore = scope.restore

        def restore_and_forget():
            patched.clear()
            restore()

        scope.restore = restore_and_forget
        return scope

    patch_once.nondet_patched_once = True
    interpreter._patch_lang = patch_once
