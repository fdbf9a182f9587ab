"""Where a process's wall time goes, by sampling its main thread's Python stack.

    from stack_sampler import start_sampling; start_sampling(every_s=0.005)

A daemon thread reads the main thread's frame (sys._current_frames) every `every_s` seconds and counts, per
sample, each function on the stack once (inclusive time), the innermost one (self time), and that one by the
innermost nondet function above it (which of our calls the time is spent under). At exit it prints the
functions with the most seconds (samples x every_s). cProfile lost nondet's frames under dynamo
(gpu_probe_cli.py's docstring); sampling the frames sees whatever Python is running, compiled code's
launchers included. Time in C below a Python frame counts to that frame; C code that holds the GIL for long
delays the sampler, so such stretches are undercounted (the seconds are a lower bound).
"""

import atexit
import collections
import os
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # paths shown from here

INCLUSIVE: collections.Counter = collections.Counter()  # "file:line function" -> samples with it on the stack
SELF: collections.Counter = collections.Counter()  # the same key -> samples with it innermost
PAIRS: collections.Counter = collections.Counter()  # (innermost nondet frame, innermost frame) -> samples
SAMPLES = [0]


def _key(code) -> str:
    path = code.co_filename
    short = path.split("site-packages/")[-1] if "site-packages/" in path else path.removeprefix(REPO + os.sep)
    return f"{short}:{code.co_firstlineno} {code.co_name}"


def _is_ours(frame) -> bool:
    return frame.f_globals.get("__name__", "").split(".")[0] == "nondet"


def _sample(main_id: int, every_s: float) -> None:
    while True:
        time.sleep(every_s)
        frame = sys._current_frames().get(main_id)
        if frame is None:
            continue
        SAMPLES[0] += 1
        leaf = _key(frame.f_code)
        SELF[leaf] += 1
        seen, ours = set(), ""
        while frame is not None:
            key = _key(frame.f_code)
            seen.add(key)
            if not ours and _is_ours(frame):
                ours = key  # the nondet code this sample's time is spent under
            frame = frame.f_back
        INCLUSIVE.update(seen)
        PAIRS[(ours, leaf)] += 1


def _report(every_s: float, top: int) -> None:
    print(f"\n== sampled stacks: {SAMPLES[0]} samples, one per {every_s * 1000:.0f} ms (seconds)", file=sys.stderr)
    for title, counter in (("inclusive", INCLUSIVE), ("self", SELF)):
        print(f"-- {title}", file=sys.stderr)
        for key, count in counter.most_common(top):
            if count * every_s >= 0.2:
                print(f"  {count * every_s:6.2f}  {key}", file=sys.stderr)
    print("-- self, under the innermost nondet function", file=sys.stderr)
    for (ours, leaf), count in PAIRS.most_common(top):
        if count * every_s >= 0.1:
            print(f"  {count * every_s:6.2f}  {ours or '(outside nondet)'}  <-  {leaf}", file=sys.stderr)


def start_sampling(every_s: float = 0.005, top: int = 60) -> None:
    threading.Thread(target=_sample, args=(threading.main_thread().ident, every_s), daemon=True).start()
    atexit.register(_report, every_s, top)
