"""`nondet probe ARGS` in this process, then where its compile time went.

    python3 scripts/device/gpu_probe_cli.py probe --model DIR --compile ...

Runs the CLI as `python -m nondet` would, timed from before its import, and at exit prints to stderr
the wall time and torch's own compile-time breakdown (dynamo tracing, AOT autograd, Inductor, each
summed over every compiled graph: torch._dynamo.utils.compile_times; phases of half a second or more),
and dynamo's and Inductor's counters of graphs, cache hits and CUDA-graph recordings. Speed only: the
run directory is the probe's, unchanged.

The probe's stages are timed too (wall seconds and calls of each, nested: run_streams includes the
conditions' warm-ups and decodes): each stage function is wrapped before the CLI runs. (cProfile was the
first try: under dynamo on Python 3.12 it lost nondet's frames and printed zeros.)

A second process of the probe's (probes/static/compile_ahead.py: a later kernels mode compiled while the
first decodes) runs under this script too (`gpu_probe_cli.py --ahead CONFIG_FILE`), with the same stage
times, breakdown and sampler; its log, which the probe removes with its folder, is kept and printed after
this process's own figures under "== second process".
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


# (module, function or Class.method) of the probe's stages, in the order they run
STAGES = (("nondet.cli.options", "read_targets"), ("nondet.cli.probe_config", "check_context"),
          ("nondet.probes.models.loading", "load_model"), ("nondet.probes.core.kernel_coverage", "census_entry"),
          ("nondet.probes.core.compiled", "DecodePaths.warm_up"), ("nondet.probes.core.replay", "generate_condition"),
          ("nondet.probes.probe", "run_streams"), ("nondet.reports.write", "write_report"))
STAGE_TIMES: dict = {}  # "module:function" -> [seconds, calls]
AHEAD_FLAG = "--ahead"  # argv[1] of a second process run under this script
AHEAD_KEEP = "NONDET_AHEAD_KEEP"  # the folder a second process copies its log to at exit


def timed(name: str, function):
    def call(*args, **kwargs):
        began = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            entry = STAGE_TIMES.setdefault(name, [0.0, 0])
            entry[0] += time.perf_counter() - began
            entry[1] += 1
    return call


def wrap_stages() -> None:
    """Each stage wrapped where it is defined and wherever a loaded nondet module imported it by name."""
    import importlib

    for module_name, qualname in STAGES:
        module = importlib.import_module(module_name)
        owner_name, _, name = qualname.rpartition(".")
        owner = getattr(module, owner_name) if owner_name else module
        original = getattr(owner, name)
        wrapper = timed(f"{module_name.removeprefix('nondet.')}:{qualname}", original)
        setattr(owner, name, wrapper)
        if owner_name:
            continue
        for other in [m for n, m in sys.modules.items() if n.startswith("nondet") and m is not None]:
            for attribute, value in list(vars(other).items()):
                if value is original:
                    setattr(other, attribute, wrapper)


def stage_report() -> None:
    print(f"== stages (wall s, calls; nested), imports until the CLI began {IMPORTED - STARTED:.1f} s", file=sys.stderr)
    for name, (seconds, calls) in STAGE_TIMES.items():
        print(f"  {name}: {seconds:.1f} s, {calls}", file=sys.stderr)


def run_ahead_here() -> None:
    """The probe's second processes run under this script: the same stage times, breakdown and sampler in
    their logs, and each log kept in a folder of ours (the probe removes the second process's folder)."""
    import tempfile

    from nondet.probes.static import compile_ahead

    keep = tempfile.mkdtemp(prefix="nondet-ahead-logs-")
    os.environ[AHEAD_KEEP] = keep  # the second process's environment is a copy of this one's
    compile_ahead._command = lambda argument: [sys.executable, os.path.abspath(__file__), AHEAD_FLAG, str(argument)]
    atexit.register(print_ahead_logs, keep)  # registered first of the probe's: printed after its own figures


def print_ahead_logs(keep: str) -> None:
    for log in sorted(os.listdir(keep)):
        print(f"\n== second process ({log})", file=sys.stderr)
        with open(os.path.join(keep, log), errors="replace") as text:
            print(text.read().rstrip(), file=sys.stderr)


def keep_own_log(settings: str) -> None:
    """At a second process's exit (after its figures were printed), its log copied to the kept folder."""
    import shutil

    from nondet.probes.static import compile_ahead

    sys.stdout.flush()
    sys.stderr.flush()
    folder = os.path.dirname(os.path.abspath(settings))
    shutil.copy(os.path.join(folder, compile_ahead.LOG), os.path.join(os.environ[AHEAD_KEEP], f"{os.getpid()}.log"))


if __name__ == "__main__":
    ahead = len(sys.argv) > 2 and sys.argv[1] == AHEAD_FLAG
    if ahead:
        atexit.register(keep_own_log, sys.argv[2])  # runs last: after report and stage_report
    else:
        run_ahead_here()
    atexit.register(report)
    if os.environ.get("NONDET_SAMPLE_STACKS") == "1":  # where the wall time goes, function by function
        sys.path.insert(0, os.path.dirname(__file__))
        from stack_sampler import start_sampling

        start_sampling(top=int(os.environ.get("NONDET_SAMPLE_TOP", "60")))
    from nondet.cli.app import run  # as the console entry: the process ends without the teardown (fast_exit)

    wrap_stages()
    atexit.register(stage_report)  # atexit runs last-registered first: the stages, then report's wall
    IMPORTED = time.perf_counter()
    if ahead:
        from nondet.probes.ahead_process import main as ahead_main

        code = ahead_main(sys.argv[2:])
        sys.exit(code)
    run()
