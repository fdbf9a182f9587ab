"""`nondet kernels bench`: a one-line usage error where it cannot run (no CUDA, bad section)."""

import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "nondet", "kernels", *args], capture_output=True, text=True,
                          timeout=120)


def test_bench_without_cuda_is_a_usage_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the command runs for real there (scripts/device_kernels.sh)")
    proc = run("bench", "--out", "unused.md")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("nondet: error: nondet kernels bench needs a CUDA GPU; none is visible "
                                   "(run it on a GPU machine)")


def test_bench_rejects_unknown_section():
    proc = run("bench", "--only", "conv")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "nondet: error: unknown section conv; choose from matmul, rmsnorm, decode, e2e"


def test_kernels_help_lists_bench():
    proc = run("--help")
    assert proc.returncode == 0 and "bench" in proc.stdout


def test_score_refuses_a_partial_shape_set():
    proc = run("bench", "--score", "--only", "matmul")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "nondet: error: --score times the whole fixed shape set; drop --only"


def test_tune_without_cuda_is_a_usage_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is visible here: tune runs for real (scripts/gpu_run.sh tune)")
    proc = run("tune", "--out", "unused.json")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("nondet: error: nondet kernels tune needs a CUDA GPU; none is visible "
                                   "(run it on a GPU machine)")
