"""`nondet probe ARGS` in this process, then where its compile time went.

    python3 scripts/device/gpu_probe_cli.py probe --model DIR --compile ...

Runs the CLI as `python -m nondet` would, timed from before its import, and at exit prints to stderr
the wall time and torch's own compile-time breakdown (dynamo tracing, AOT autograd, Inductor, each
summed over every compiled graph: torch._dynamo.utils.compile_times; phases of half a second or more),
and dynamo's and Inductor's counters of graphs, cache hits and CUDA-graph recordings. Speed only: the
run directory is the probe's, unchanged.
"""

import atexit
import sys
import time

STARTED = time.perf_counter()


def report() -> None:
    import torch._dynamo.utils as dynamo_utils

    print(f"\n== wall {time.perf_counter() - STARTED:.1f} s (imports included)", file=sys.stderr)
    names, values = dynamo_utils.compile_times(repr="csv", aggregate=True)  # the printed table's layout varies
    phases = sorted(((float(v), name) for name, v in zip(names, values)), reverse=True)  # longest first
    for seconds, name in phases[:16]:
        if seconds >= 0.5:
            print(f"  {name}: {seconds:.1f} s", file=sys.stderr)
    counters = {k: dict(v) for k, v in dynamo_utils.counters.items() if k in ("inductor", "stats", "aot_autograd")}
    for group, values in counters.items():
        wanted = {k: n for k, n in values.items() if "cudagraph" in k or "fxgraph" in k or "autograd_cache" in k
                  or k in ("unique_graphs", "calls_captured")}
        if wanted:
            print(f"{group}: {wanted}", file=sys.stderr)


if __name__ == "__main__":
    atexit.register(report)
    from nondet.cli.app import main

    main()
