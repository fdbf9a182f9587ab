"""Are two probe runs bit for bit the same? (e.g. an H100 and an H200 under the mode, tuned vs untuned)

    python scripts/compare_runs.py RUN_A RUN_B

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
from nondet.rundir.reader import read_streams


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
    except NondetError as exc:
        print(f"compare_runs: {exc}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    print(f"{equal} of {total} streams bitwise equal")
    return 0 if not lines and total else 1


if __name__ == "__main__":
    sys.exit(main())
