"""scripts/trace_steps.py on a chrome trace built by hand: the GPU's busy and idle time split at 20 us,
the host's top-level ops (children not counted twice), and everything per token."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "trace_steps.py"


def _event(cat, name, ts, dur, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1}


def _trace(path: Path, tokens: int | None) -> Path:
    events = [
        # host: one op with a child (counted once), a runtime call, a flow event without dur (skipped)
        _event("cpu_op", "aten::linear", 0, 100),
        _event("cpu_op", "aten::mm", 10, 80),
        _event("cuda_runtime", "cudaLaunchKernel", 20, 10, tid=1),
        {"ph": "s", "cat": "ac2g", "name": "flow", "ts": 20, "id": 1, "pid": 1, "tid": 1},
        # GPU: kernels 100-200, 210-260 (a 10 us gap), 1260-1300 (a 1000 us gap); one inside another's span
        _event("kernel", "k1", 100, 100, tid=7),
        _event("kernel", "k1b", 120, 20, tid=8),
        _event("kernel", "k2", 210, 50, tid=7),
        _event("kernel", "k3", 1260, 40, tid=7),
    ]
    doc = {"traceEvents": events}
    if tokens is not None:
        doc["tokens"] = tokens
    with gzip.open(path, "wt") as out:
        json.dump(doc, out)
    return path


def _run(*args) -> str:
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_busy_idle_and_host_time_per_token(tmp_path):
    out = _run(_trace(tmp_path / "t.json.gz", tokens=2))
    first = out.splitlines()[0]
    # span 0-1300 us; kernels busy 100+50+40 = 190 us; idle 10 us short, 1000 us long; host busy 100 us
    assert "per 2: span 0.65 ms" in first
    assert "GPU kernels 0.10 ms in 2 kernels" in first  # 190 us / 2 = 0.095 ms; 4 kernels / 2
    assert "idle 0.01 ms in gaps < 20 us, 0.50 ms in longer ones" in first
    assert "host in torch ops or runtime calls 0.05 ms, in neither 0.60 ms" in first
    assert "aten::linear 0.050 x0.5" in out and "aten::mm" not in out  # the child is not a top-level op
    assert "cudaLaunchKernel 0.005 x0.5" in out


def test_without_a_tokens_field_per_divides(tmp_path):
    out = _run(_trace(tmp_path / "t.json.gz", tokens=None), "--per", 1)
    assert "per 1: span 1.30 ms" in out and "idle 0.01 ms in gaps < 20 us, 1.00 ms in longer ones" in out
