"""`nondet probe ARGS` in this process, then where its compile time went.

    python3 scripts/device/gpu_probe_cli.py probe --model DIR --compile ...

Runs the CLI as `python -m nondet` would, timed from before its import, and at exit prints to stderr
the wall time and torch's own compile-time breakdown (dynamo tracing, AOT autograd, Inductor, each
summed over every compiled graph: torch._dynamo.utils.compile_times; phases of half a second or more),
and dynamo's and Inductor's counters of graphs, cache hits and CUDA-graph recordings. Speed only: the
run directory is the probe's, unchanged.

PROBE_CLI_PROFILE=FILE runs the CLI under cProfile, writes its stats to FILE and prints the time of each of
nondet's stages (cumulative: a stage includes the imports it makes first, e.g. load_model transformers'
modeling modules; profiler overhead included: a step's Python calls run slower under it, so read the
stages outside the decode loop as they are and the loop's as an upper bound).
"""

import atexit
import os
import sys
import time

STARTED = time.perf_counter()


def report() -> None:
    print(f"\n== wall {time.perf_counter() - STARTED:.1f} s (imports included)", file=sys.stderr)
    if "torch._dynamo.utils" not in sys.modules:  # the CLI stopped before anything compiled (bad input)
        return
    import torch._dynamo.utils as dynamo_utils

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


# (file suffix, function) of the probe's stages, in the order they run (a cProfile entry's cumulative time)
STAGES = (("cli/options.py", "read_targets"), ("cli/probe_config.py", "check_context"),
          ("models/loading.py", "load_model"), ("core/kernel_coverage.py", "census_entry"),
          ("core/compiled.py", "warm_up"), ("core/replay.py", "generate_condition"),
          ("probes/probe.py", "run_streams"), ("reports/write.py", "write_report"))


def stage_times(stats_file: str) -> None:
    import pstats

    stats = pstats.Stats(stats_file).stats  # (file, line, function) -> (calls, _, tottime, cumtime, callers)
    print("== stages under cProfile (cumulative s)", file=sys.stderr)
    for suffix, function in STAGES:
        seconds = sum(v[3] for (file, _, name), v in stats.items() if name == function and file.endswith(suffix))
        print(f"  {suffix}:{function}: {seconds:.1f} s", file=sys.stderr)


def profiled(main, stats_file: str) -> None:
    import cProfile

    profile = cProfile.Profile()
    try:
        profile.runcall(main)
    finally:  # main exits through SystemExit
        profile.dump_stats(stats_file)
        stage_times(stats_file)


if __name__ == "__main__":
    atexit.register(report)
    from nondet.cli.app import main

    if os.environ.get("PROBE_CLI_PROFILE"):
        profiled(main, os.environ["PROBE_CLI_PROFILE"])
    else:
        main()
