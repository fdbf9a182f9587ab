"""The second process of probes/static/compile_ahead.py: a later kernels mode's first condition decoded, so
that its compiled decode step is saved under NONDET_CACHE while the probe that started it runs the first mode;
eager or under `--cuda-graphs`, the mode's conditions decoded, last first, their rows handed to the probe
(static/decode_ahead.py).

    python -m nondet.probes.ahead_process CONFIG_FILE      (the probe's config, as compile_ahead wrote it)

The probe's own static source, under the probe's numerics scope (what the step's graph reads); no run
directory: what it leaves is the saved step, or the rows in CONFIG_FILE's folder. A NondetError ends it with
its exit code and one line, as the CLI's; the probe reads that line. At a good end it writes the time
(time.time()) to FINISHED beside CONFIG_FILE: when it ended, which the probe's wait cannot tell where it came
later.
"""

import json
import sys
import time
from pathlib import Path

from nondet.errors import NondetError


def main(argv: list[str]) -> int:
    from nondet.probes.core.numerics import numerics_scope
    from nondet.probes.core.stored_config import from_stored
    from nondet.probes.probe import ProbeConfig, run_streams
    from nondet.probes.static.compile_ahead import FINISHED
    from nondet.probes.static.decode_ahead import decode_from_the_end
    from nondet.probes.static.source import StaticSource

    config = from_stored(ProbeConfig, json.loads(Path(argv[0]).read_text()))
    source = StaticSource(config)
    try:
        with numerics_scope(config.threads):
            source.open()
            if config.compile_backend:
                run_streams(source, None)
            else:
                decode_from_the_end(source, Path(argv[0]).parent)
    except NondetError as exc:
        print(f"{type(exc).__name__}: {exc}")
        return exc.exit_code
    finally:
        source.close()
    (Path(argv[0]).parent / FINISHED).write_text(repr(time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
