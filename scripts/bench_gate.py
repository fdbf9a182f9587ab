"""Time `nondet gate` on its CPU benchmark case, in this tree or another checkout, side by side.

    python scripts/bench_gate.py                          # this tree: 8 prompts x 300 tokens x 1,2,4,8
    python scripts/bench_gate.py --tree /tmp/before       # another checkout (e.g. git worktree add
                                                          #   /tmp/before REVISION)
    python scripts/bench_gate.py --kernels batch-invariant

Runs the gate in a subprocess with PYTHONPATH pointing at the tree, the 8 built-in demo
prompts passed as --prompt (so older trees get the same work), --no-bisect (bisect is a
diagnosis after the verdict, not part of it). The embedded model is built before the clock
starts. Prints wall time, exit code (1 = batch-variant, 0 = policy met) and the verdict line,
next to reference figures for `nondet gate` before the row plan (2026-11-23: 111.8 s) and
detLLM 0.1.1 (77.8 s).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nondet.probes.core.corpus import DEMO_PROMPTS

GATE_BEFORE_SECONDS = 111.8  # nondet gate on this case before the row plan (2026-11-23)
DETLLM_SECONDS = 77.8  # detLLM 0.1.1 on the same model, prompts and sizes


def main() -> None:
    args = _parse()
    tree = Path(args.tree).resolve()
    wall, code, verdict = time_gate(tree, args.prompts, args.tokens, args.batch_sizes, args.kernels)
    print(f"tree: {tree} ({_commit(tree)}); {args.prompts} prompts x {args.tokens} tokens x batch sizes "
          f"{args.batch_sizes}, kernels {args.kernels}")
    print(f"wall time: {wall:.1f} s, exit code {code}")
    print(f"verdict: {verdict[:200]}")
    print(f"reference figures on this kind of machine: nondet gate before the row plan {GATE_BEFORE_SECONDS} s, "
          f"detLLM {DETLLM_SECONDS} s (scripts/bench_gate_detllm.py measures detLLM here)")


def time_gate(tree: Path, prompts: int, tokens: int, batch_sizes: str, kernels: str,
              model: str | None = None, extra: tuple[str, ...] = (), env_extra: dict | None = None
              ) -> tuple[float, int, str]:
    """(wall seconds, exit code, verdict line) of `nondet gate` from `tree` on the first `prompts` demo prompts.
    model: a model directory (--model); None = the tree's embedded default, the random-weight one
    (NONDET_DEMO_MODEL=random: the trained demo is another, slower model), its injected norm included."""
    env = {**os.environ, "PYTHONPATH": str(tree), "GITHUB_ACTIONS": "", "NONDET_DEMO_MODEL": "random",
           **(env_extra or {})}  # e.g. a NONDET_CACHE of its own
    _build_model(env)
    work = Path(tempfile.mkdtemp(prefix="nondet-bench-gate-"))
    (work / ".git").mkdir()  # a repository root: no config file above it is read
    argv = [sys.executable, "-m", "nondet", "gate", "--batch-sizes", batch_sizes,
            "--max-new-tokens", str(tokens), "--kernels", kernels, "--no-bisect", "--out", "run"]
    argv += ["--model", model] if model else []
    argv += list(extra)  # e.g. --positions padded
    for prompt in DEMO_PROMPTS[:prompts]:
        argv += ["--prompt", prompt]
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    verdict = next((line for line in proc.stdout.splitlines() if line.startswith("nondet gate:")), proc.stderr[-300:])
    return wall, proc.returncode, verdict


def _build_model(env: dict) -> None:
    """Materialise the embedded model (cached) so its one-off build is not timed."""
    subprocess.run([sys.executable, "-c", "from nondet.probes.models.default_model import default_model_dir; "
                    "default_model_dir()"], env=env, check=True, capture_output=True)


def _commit(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "not a git checkout"


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--batch-sizes", default="1,2,4,8")
    p.add_argument("--prompts", type=int, default=len(DEMO_PROMPTS))
    p.add_argument("--kernels", default="default")
    return p.parse_args()


if __name__ == "__main__":
    main()
