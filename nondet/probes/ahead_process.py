"""The second process of probes/static/compile_ahead.py: a later kernels mode's first condition decoded, so
that its compiled decode step is saved under NONDET_CACHE while the probe that started it runs the first mode;
under `--cuda-graphs`, the mode's conditions warmed up alone, last first, so that their Triton binaries are in
the on-disk cache when the probe reaches them.

    python -m nondet.probes.ahead_process CONFIG_FILE      (the probe's config, as compile_ahead wrote it)

The probe's own static source and loop, under the probe's numerics scope (what the step's graph reads); no
run directory: what it leaves is the saved step. A NondetError ends it with its exit code and one line, as
the CLI's; the probe reads that line. At a good end it writes the time (time.time()) to FINISHED beside
CONFIG_FILE: when it ended, which the probe's wait cannot tell where it came later.
"""

import json
import os
import sys
import time
from pathlib import Path

from nondet.errors import NondetError

NICE = 10  # the --cuda-graphs second process's scheduling priority, below the probe's


def main(argv: list[str]) -> int:
    from nondet.probes.core.numerics import numerics_scope
    from nondet.probes.core.stored_config import from_stored
    from nondet.probes.probe import ProbeConfig, run_streams
    from nondet.probes.static.compile_ahead import FINISHED
    from nondet.probes.static.source import StaticSource

    config = from_stored(ProbeConfig, json.loads(Path(argv[0]).read_text()))
    if config.cuda_graphs:  # not waited for: it takes what the probe leaves of the host (Triton's compiler is threaded)
        os.nice(NICE)
    source = StaticSource(config)
    try:
        with numerics_scope(config.threads):
            source.open()
            if config.cuda_graphs:
                warm_up_from_the_end(source)
            else:
                run_streams(source, None)
    except NondetError as exc:
        print(f"{type(exc).__name__}: {exc}")
        return exc.exit_code
    finally:
        source.close()
    (Path(argv[0]).parent / FINISHED).write_text(repr(time.time()))
    return 0


def warm_up_from_the_end(source) -> None:
    """Each batch shape's warm-up, the probe's last first: the probe begins with the first, so the two meet
    in the middle rather than compile the same binaries side by side."""
    for planned in reversed(source.plan()):
        source.warm_up(planned)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
