"""Running a test file's Triton checks under TRITON_INTERPRET=1 on the CPU, or compiling for a GPU
target without one (`rerun_compiling_for_gpus`: Triton ships ptxas).

TRITON_INTERPRET must be set before triton is first imported, which another test may already have
done in this process, so a file re-runs itself in a fresh interpreter with the variable set
(`rerun_under_interpreter`); its checks are collected only there. `emulate_mma_rows` makes the
interpreter's tl.dot compute each row from that row alone, as a GPU's MMA does.
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
