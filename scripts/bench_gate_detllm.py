"""`nondet gate` and detLLM 0.1.1 on the same CPU work, side by side: the gate's speed target.

    python scripts/bench_gate_detllm.py [--env DIR] [--prompts 8] [--tokens 300] [--workers N|auto] [--compiled]

The work: the embedded model (a random Qwen3, hidden 512, 4 layers, bf16), the first N built-in
prompts, N new tokens, batch sizes 1, 2, 4, 8, default kernels. detLLM runs
`detllm check --backend hf --runs 1 --batch-size 1 --vary-batch 2,4,8` (each prompt at batch
size 1, then the prompts in batches of 2, 4 and 8: the same generate calls a padded sweep makes);
nondet runs `nondet gate --no-bisect` (scripts/bench_gate.py), with its row plan (no compared row
padded) and with `--positions padded` (detLLM's calls, left-padded), each as the gate's default
(`--workers auto`: the number of processes it picks here) and in one process (`--workers 1`); with
`--workers N` also with N processes decoding the calls at once, the cores shared out. `--fail-fast`
rows first: each batched call stopped once its rows' verdicts are settled (the default kernels fail
here, so this is the failing gate's time; a passing gate decodes every step, as the rows without it).
detLLM lives in its own virtual environment (--env, default $NONDET_CACHE/detllm-0.1.1), created on
first use with detLLM 0.1.1 and this environment's torch version, so both time the same torch
kernels. Prints one table.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_gate import time_gate  # noqa: E402

from nondet.probes.core.corpus import DEMO_PROMPTS  # noqa: E402
from nondet.probes.models.default_model import cache_root, default_model_dir  # noqa: E402

DETLLM = "detllm[hf]==0.1.1"


def detllm_env(path: Path) -> Path:
    """The detllm command of a venv at path; the venv is made (detLLM + this torch) when missing."""
    import torch

    exe = path / "bin" / "detllm"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        torch_pin = f"torch=={torch.__version__.split('+')[0]}"
        subprocess.run([str(path / "bin" / "pip"), "install", "-q", DETLLM, torch_pin], check=True)
    return exe


def time_detllm(exe: Path, model: Path, prompts: int, tokens: int) -> tuple[float, int]:
    work = Path(tempfile.mkdtemp(prefix="detllm-bench-"))
    prompt_file = work / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps(p) + "\n" for p in DEMO_PROMPTS[:prompts]))
    argv = [str(exe), "--quiet", "check", "--backend", "hf", "--model", str(model), "--prompt-file", str(prompt_file),
            "--tier", "1", "--runs", "1", "--batch-size", "1", "--vary-batch", "2,4,8", "--max-new-tokens",
            str(tokens), "--device", "cpu", "--dtype", "bfloat16", "--out", str(work / "out")]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode not in (0, 1):
        print(proc.stderr[-800:])
    return time.perf_counter() - started, proc.returncode


def main() -> None:
    args = _parse()
    exe = detllm_env(Path(args.env))
    model = Path(default_model_dir())
    tree = Path(__file__).resolve().parents[1]
    # each row printed as it is measured (flushed): a run stopped by a time limit keeps the rows it has
    print(f"{args.prompts} prompts x {args.tokens} tokens x batch sizes 1,2,4,8, default kernels, the embedded model")
    print("| tool | wall (s) | exit | speed vs detLLM |\n| --- | ---: | ---: | ---: |", flush=True)
    detllm, detllm_code = time_detllm(exe, model, args.prompts, args.tokens)
    print(f"| detLLM 0.1.1 | {detllm:.1f} | {detllm_code} | 1.00x |", flush=True)
    padded = ("--positions", "padded")
    rows = [("nondet gate --fail-fast (workers auto)", ("--fail-fast",)),
            ("nondet gate --fail-fast --workers 1", ("--fail-fast", "--workers", "1")),
            ("nondet gate (workers auto: the default)", ()), ("nondet gate --workers 1", ("--workers", "1")),
            ("nondet gate --positions padded (detLLM's calls)", padded),
            ("nondet gate --positions padded --workers 1", (*padded, "--workers", "1"))]
    if args.workers != "auto":
        workers = ("--workers", str(args.workers))
        rows += [(f"nondet gate --workers {args.workers}", workers),
                 (f"nondet gate --positions padded --workers {args.workers}", (*padded, *workers))]
    verdicts = {}
    for label, flags in rows:
        wall, code, said = time_gate(tree, args.prompts, args.tokens, "1,2,4,8", "default", str(model), flags)
        verdicts.setdefault("--fail-fast" in flags, said)
        print(f"| {label} | {wall:.1f} | {code} | {detllm / wall:.2f}x |", flush=True)
    if args.compiled:  # the gate on the compiled path: its steps saved by the first run, loaded by the second
        cache = {"NONDET_CACHE": tempfile.mkdtemp(prefix="nondet-bench-cache-")}
        for run in ("cold cache", "warm cache"):
            wall, code, _ = time_gate(tree, args.prompts, args.tokens, "1,2,4,8", "default", str(model),
                                      ("--compile",), cache)
            print(f"| nondet gate --compile, {run} | {wall:.1f} | {code} | {detllm / wall:.2f}x |", flush=True)
    for fail_fast, said in verdicts.items():
        print(f"gate verdict{' with --fail-fast' if fail_fast else ''}: {said[:160]}")


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default=str(cache_root() / "detllm-0.1.1"))
    p.add_argument("--prompts", type=int, default=len(DEMO_PROMPTS))
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--workers", default="auto", help="also rows with --workers N (auto, the default: no extra rows)")
    p.add_argument("--compiled", action="store_true",
                   help="also `nondet gate --compile` from a new NONDET_CACHE, then again (saved decode steps)")
    return p.parse_args()


if __name__ == "__main__":
    main()
