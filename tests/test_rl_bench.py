"""scripts/bench_rl.py smoke run on the CPU: the table has one row per micro-batch, the ratio is default / mode."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_rl.py"


def test_bench_rl_tiny_prints_the_table():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--micro-batch", "1,4", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[2].split()[:7] == ["micro-batch", "tokens", "default", "ms", "batch-invariant", "ms", "throughput"]
    assert [ln.split()[:2] for ln in lines[3:5]] == [["1", "16"], ["4", "64"]]
    assert lines[5].startswith("throughput ratio = default / batch-invariant step time; worst ")
    rows = json.loads(lines[6])["rows"]
    assert [r["micro_batch"] for r in rows] == [1, 4]
    assert all(r["throughput_ratio"] == pytest.approx(r["default_ms"] / r["batch_invariant_ms"]) for r in rows)


@pytest.mark.slow  # torch.compile on the CPU
def test_bench_rl_compiled_forward_runs_under_both_kernels():
    """--compile: the trainer step through torch.compile (Inductor on the CPU), default and the mode."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--micro-batch", "1", "--compile", "--json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "torch.compile'd forward (Inductor)" in proc.stdout
    (row,) = json.loads(proc.stdout.splitlines()[-1])["rows"]
    assert row["default_first_s"] > 0 and row["batch_invariant_first_s"] > 0 and row["batch_invariant_ms"] > 0
