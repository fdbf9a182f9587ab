"""The prefetch threads of a GPU probe (nondet/kernels/prefetch.py: Triton's cache key, the CUDA context, cuBLAS
and the attention libraries loaded beside the model's load) leave every stream's bits as a probe without them
(NONDET_PREFETCH=0), default kernels and the mode. Control: the comparison sees bits: with the injected batch-variant
norm (--inject-variance) the default kernels' runs of one probe differ among themselves, and the mode's do not."""

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def _probe(gpu_model_dir, out, **env) -> dict:
    import os
    import subprocess
    import sys

    from nondet.rundir import RunDir
    from nondet.rundir.reader import read_streams

    argv = ["probe", "--model", str(gpu_model_dir), "--device", "cuda", "--confirm", "-b", "1,3,8", "-n", "24",
            "-p", "Tell me about Richard Feynman", "--cuda-graphs", "--inject-variance", "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "nondet", *argv], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {(s.kernels, s.condition_id, s.position): s.steps for s in read_streams(RunDir(out), whole=True)}


def test_a_probe_with_the_prefetch_threads_keeps_the_bits_of_one_without(gpu_model_dir, tmp_path):
    with_threads = _probe(gpu_model_dir, tmp_path / "with")
    without = _probe(gpu_model_dir, tmp_path / "without", NONDET_PREFETCH="0")
    assert with_threads == without
    default = [steps for (kernels, _, _), steps in without.items() if kernels == "default"]
    assert any(steps != default[0] for steps in default)  # the control: these streams carry differing bits
    mode = [steps for (kernels, _, _), steps in without.items() if kernels == "batch-invariant"]
    assert mode and all(steps == mode[0] for steps in mode)
