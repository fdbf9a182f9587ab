"""A run directory as `nondet bisect`'s input, checked before a model loads.

bisect loads a model and replays for minutes, then writes into the run directory: a bad record that
only the replay (or the report after it) read, or a directory it cannot write, used to cost all of
that time, and a read-only one its result. Checked first, in well under a second: a finished run that
bisect may write into, with a whole config.json (which replay runs is read from it); then, for a probe
run, the target its summary names (errors that say what to do next: no divergent condition, an unknown
--condition); last, every record, as `nondet report` reads them.
"""

from nondet.probes.bisect.bisect import BisectConfig
from nondet.probes.bisect.choose import choose_target
from nondet.rundir import RunDir
from nondet.rundir.reader import (check_records, has_header, read_conditions, read_header, read_summary_dict,
                                  require_finished)
from nondet.rundir.records import to_json
from nondet.rundir.writer import require_writable


def check_run_dir(run_dir) -> None:
    """Finished, writable, config.json whole: what telling a probe run from an rl or --tp one needs."""
    rd = RunDir(run_dir)
    require_finished(rd)  # an interrupted probe's streams are no basis for a bisect
    require_writable(rd, "bisect")
    if has_header(rd):
        read_header(rd)


def check_inputs(config: BisectConfig, chooses: bool) -> None:
    """chooses: a probe run, whose target choose.py picks (an rl or --tp run picks its own, later)."""
    rd = RunDir(config.run_dir)
    if chooses:
        conditions = [to_json(c) for c in read_conditions(rd)]  # checked records, as choose_target reads them
        choose_target(conditions, read_summary_dict(rd), str(rd.path), config.condition, config.position)
    check_records(rd)
