"""Are two probe runs bit for bit the same? (e.g. an H100 and an H200 under the mode, tuned vs untuned)

    python scripts/compare_runs.py RUN_A RUN_B

Prints first, when the two runs' environments (fingerprint.json) differ in a setting that can move
bits (device, CPU instruction set, library versions, dtype, kernels, kernel table, decode path),
one line naming each such setting with both values: the cause to look at when streams differ, and
what a "bitwise equal" verdict spans when they do not.

Pairs the streams of two run directories by (condition, row, prompt, occurrence) and compares
every step's token and logprob bits (float.hex as recorded). Prints one line per stream that
differs (first token / first logprob-bits divergence) and a last line `N of M streams bitwise
equal`. Exit 0 when every stream of A has its twin in B and all are equal, 1 otherwise, 2 on a
run directory that cannot be read. Both runs must come from the same probe command (the same
prompts, batch sizes, tokens and kernels): e.g. run `nondet probe --kernels batch-invariant
--out $OUT/run` on each machine and bring one run directory to the other.
"""

import argparse
import sys
from collections import Counter

from nondet.errors import NondetError
from nondet.rundir import RunDir
from nondet.rundir.reader import read_document, read_streams


# fingerprint.json settings that can change a stream's bits (threads are left out: the mode's bits do
# not follow them, and the default kernels' differences are what a comparison is there to find)
NUMERIC_SETTINGS = ("device", "cpu_capability", "torch", "triton", "transformers", "cuda", "dtype", "kernels",
                    "kernel_tuning", "decode_path")


def environment_differences(run_a: str, run_b: str) -> list[str]:
    """'setting: A | B' for each NUMERIC_SETTINGS entry the two fingerprints disagree on (none when
    either run has no fingerprint.json)."""
    fa, fb = (read_document(RunDir(run), "fingerprint.json", {}) for run in (run_a, run_b))
    if not fa or not fb:
        return []
    return [f"{key}: {fa.get(key)} | {fb.get(key)}" for key in NUMERIC_SETTINGS if fa.get(key) != fb.get(key)]


def keyed(run: str) -> dict[tuple, list]:
    """(condition_id, position, prompt_id, n-th such stream) -> steps."""
    seen: Counter = Counter()
    out = {}
    for s in read_streams(RunDir(run)):
        base = (s.condition_id, s.position, s.prompt_id)
        out[(*base, seen[base])] = s.steps
        seen[base] += 1
    return out


def first(a: list, b: list, field: str) -> int | None:
    """The first StepRecord whose `field` differs (a length difference counts at the shorter end)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if getattr(x, field) != getattr(y, field):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(run_a: str, run_b: str) -> tuple[list[str], int, int]:
    """(lines for the streams that differ, streams equal, streams in A)."""
    a, b = keyed(run_a), keyed(run_b)
    lines, equal = [], 0
    for key, steps in a.items():
        other = b.get(key)
        if other is None:
            lines.append(f"{key[0]} row {key[1]} prompt {key[2]}: not in {run_b}")
            continue
        token, bits = first(steps, other, "token"), first(steps, other, "logprob")
        if token is None and bits is None:
            equal += 1
        else:
            lines.append(f"{key[0]} row {key[1]} prompt {key[2]}: first token divergence {token}, "
                         f"first logprob-bits divergence {bits}")
    lines += [f"{k[0]} row {k[1]} prompt {k[2]}: not in {run_a}" for k in b if k not in a]
    return lines, equal, len(a)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_a")
    p.add_argument("run_b")
    args = p.parse_args()
    try:
        lines, equal, total = compare(args.run_a, args.run_b)
        settings = environment_differences(args.run_a, args.run_b)
    except NondetError as exc:
        print(f"compare_runs: {exc}", file=sys.stderr)
        return 2
    if settings:
        print("environments differ in " + "; ".join(settings))
    for line in lines:
        print(line)
    print(f"{equal} of {total} streams bitwise equal")
    return 0 if not lines and total else 1


if __name__ == "__main__":
    sys.exit(main())
