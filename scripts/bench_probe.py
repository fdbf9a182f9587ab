"""Benchmark the static probe: wall time and time per decode step for a fixed setup.

    python scripts/bench_probe.py                       # issue 17's CPU case: 8 prompts x 300 tokens x 1,2,4,8
    python scripts/bench_probe.py --tokens 200 --batch-sizes 1,2,8   # the README's first command
    python scripts/bench_probe.py --placement ends      # the per-prompt filler sweep (the plan before issue 17)

Prints one line per figure: wall time (model load excluded: it is the same before and after),
generate calls, decode steps (one forward of a whole batch; summed over calls) and wall time
per decode step, plus the verdict's counts so a faster run is seen to find the same things.
Runs through the library (run_probe) on the embedded default model, so it needs no network.
It works on trees from before issue 17 too (`--placement ends`), for before/after figures.
"""

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from nondet.probes.corpus import DEMO_PROMPTS
from nondet.probes.loading import ModelSpec, load_model
from nondet.probes.probe import ProbeConfig, run_probe

DETLLM_SECONDS = 77.8  # detLLM 0.1.1 on issue 17's CPU case, measured on this kind of machine (issue 17)
GATE_SECONDS = 111.8  # `nondet gate` on the same case before issue 17 (issue 17)


def main() -> None:
    args = _parse()
    config = _config(args)
    load_model(config.model)  # warm: the first load builds and caches the embedded model
    started = time.perf_counter()
    result = run_probe(config)
    wall = time.perf_counter() - started
    calls, steps = _calls_and_steps(result.run_dir)
    m = result.summary["modes"]["default"]
    print(f"setup: {len(config.targets)} prompts x {args.tokens} tokens x batch sizes {args.batch_sizes}, "
          f"placement {_placement(config)}, {platform.processor() or platform.machine()}")
    print(f"wall time: {wall:.1f} s (probe, model loaded)")
    print(f"generate calls: {calls}, compared streams: {m['n_runs']}, decode steps: {steps}")
    print(f"time per decode step: {1000 * wall / steps:.2f} ms")
    print(f"prompts whose tokens differ: {m.get('prompts_diverged', '-')} of {m.get('n_prompts', 1)}; "
          f"first token divergence {m['first_token_divergence']}, numeric {m['first_numeric_divergence']}")
    print(f"for comparison (issue 17, same kind of machine): detLLM {DETLLM_SECONDS} s, "
          f"nondet gate before {GATE_SECONDS} s")


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--batch-sizes", default="1,2,4,8")
    p.add_argument("--prompts", type=int, default=len(DEMO_PROMPTS), help="the first N built-in prompts")
    p.add_argument("--placement", default=None, help="default: the tree's own default for several prompts")
    return p.parse_args()


def _config(args) -> ProbeConfig:
    sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    extra = {"placement": args.placement} if args.placement else {}
    out = Path(tempfile.mkdtemp(prefix="nondet-bench-")) / "run"
    return ProbeConfig(prompts=DEMO_PROMPTS[:args.prompts], model=ModelSpec(), batch_sizes=sizes,
                       max_new_tokens=args.tokens, out=str(out), **extra)


def _placement(config) -> str:
    if config.placement != "auto":
        return config.placement
    return "auto (rows)" if len(config.targets) > 1 and config.runs is None else "auto (ends)"


def _calls_and_steps(run_dir) -> tuple[int, int]:
    """Generate calls (conditions) and decode steps: per call, its longest stream's steps."""
    longest: dict[str, int] = {}
    for line in (Path(run_dir) / "streams.jsonl").read_text().splitlines():
        s = json.loads(line)
        longest[s["condition_id"]] = max(longest.get(s["condition_id"], 0), len(s["steps"]))
    return len(longest), sum(longest.values())


if __name__ == "__main__":
    main()
