"""`nondet kernels bench`: a one-line usage error where it cannot run (no CUDA, bad section)."""


import pytest
import cli_runner


def run(*args):
    return cli_runner.run(["kernels", *args], timeout=120)


@pytest.mark.parametrize("command, out", [("bench", "unused.md"), ("tune", "unused.json")])
def test_gpu_commands_without_cuda_are_a_usage_error(command, out):
    import torch

    if torch.cuda.is_available():
        pytest.skip(f"a CUDA GPU is visible: {command} runs for real there (scripts/gpu.sh score)")
    proc = run(command, "--out", out)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"nondet: error: nondet kernels {command} needs a CUDA GPU; none is visible "
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
