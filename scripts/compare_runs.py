"""`nondet compare RUN_A RUN_B` under its earlier name (scripts/gpu.sh's cross-compare step and the
commands recorded in docs/benchmarks.md call it): the same output and exit codes (nondet/cli/compare.py)."""

import sys

from nondet.cli.app import main

if __name__ == "__main__":
    sys.argv = ["nondet", "compare", *sys.argv[1:]]
    main()
