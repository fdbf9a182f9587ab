"""Validated reading of a probe's run directory into typed records.

Every file is checked against its record type (records.py): a record of the wrong shape is
a RunDirError naming the file, its line and the field. Run directories written before typed
records (format 1: no format_version, no prompt_id) read the same way; a format newer than this
nondet knows is refused with a line naming both versions.

A run is finished when its summary.json exists: the writer writes it last, atomically, after every
stream, and takes it away when a resumed run adds to the directory again (writer.py). Directories
of every format read by this one rule: one written before it existed has a summary.json exactly
when its probe got to the end. A started run without one (config.json or streams.jsonl but no
summary.json) was interrupted, killed, or is still running: `require_finished` refuses it.
"""

from nondet.errors import RunDirError
from nondet.rundir.files import (ABLATION, BISECT, BISECT_MODULES, CONDITIONS, CONFIG, FINGERPRINT, GATE, STREAMS,
                                 SUMMARY, RunDir)
from nondet.rundir.records import (FORMAT_VERSION, ConditionRecord, Header, StreamRecord, Summary, document,
                                   from_json)


def read_header(rd: RunDir) -> Header:
    header = from_json(Header, rd.read_json(CONFIG), str(rd.file(CONFIG)))
    if header.format_version > FORMAT_VERSION:
        raise RunDirError(f"{rd.file(CONFIG)}: run directory format {header.format_version} is newer than "
                          f"this nondet reads ({FORMAT_VERSION}); upgrade nondet")
    return header


def require_finished(rd: RunDir) -> None:
    """RunDirError unless the run directory exists and, where a run began in it, finished (summary.json).
    A directory holding none of a run's files is left to the caller's own check of what it needs."""
    rd.require()
    started = has_header(rd) or has_streams(rd)
    if started and not rd.exists(SUMMARY):
        raise RunDirError(f"{rd.path}: unfinished run (no summary.json: it was interrupted, killed, or is still "
                          f"running); {_next_step(rd)}")
    if has_streams(rd) and rd.blank(STREAMS):
        _require_no_runs_counted(rd)


def _require_no_runs_counted(rd: RunDir) -> None:
    """A finished run whose streams.jsonl is empty lost its streams (a copy cut short, a full disk): every
    verdict read from it would contradict its own summary.json, which counts the runs."""
    counted = sum(mode["n_runs"] for mode in read_summary(rd).modes.values())
    if counted:
        raise RunDirError(f"{rd.file(STREAMS)} is empty, but {SUMMARY} counts {counted} runs; the streams were "
                          "lost (copy the run directory again, or run the probe again)")


def _next_step(rd: RunDir) -> str:
    """A server probe (without --against) can be finished where it stopped; anything else is run again."""
    try:
        load = read_header_dict(rd)["config"]["load"]
        resumable = load["mode"] == "server" and not load.get("against")
    except (RunDirError, KeyError, TypeError, AttributeError):  # no config.json, or an older or odd one
        resumable = False
    return f"finish it with `nondet probe --resume {rd.path}`" if resumable else "run it again"


def read_conditions(rd: RunDir, whole: bool = False) -> list[ConditionRecord]:
    """whole: a torn last record is an error (a comparison of two runs), not a warning and a partial read."""
    return _records(rd, CONDITIONS, ConditionRecord, whole)


def read_streams(rd: RunDir, whole: bool = False) -> list[StreamRecord]:
    """whole: a torn last record is an error (a comparison of two runs), not a warning and a partial read."""
    return _records(rd, STREAMS, StreamRecord, whole)


def _records(rd: RunDir, name: str, cls, whole: bool) -> list:
    where = str(rd.file(name))
    return [from_json(cls, record, f"{where}:{line}") for line, record in rd.read_jsonl_lines(name, whole)]


def torn_records(rd: RunDir) -> str:
    """'' or which record a crash cut off mid-write (a partial read leaves it out and warns), for a
    verdict to say that it is partial."""
    torn = [f"{rd.file(name)}:{line}" for name in (STREAMS, CONDITIONS)
            if (line := rd.torn_line(name)) is not None]
    return f"a record cut off mid-write at {' and '.join(torn)} is left out" if torn else ""


def read_summary(rd: RunDir) -> Summary:
    return from_json(Summary, rd.read_json(SUMMARY), str(rd.file(SUMMARY)))


def check_records(rd: RunDir) -> None:
    """Read every record of a finished run's config.json, fingerprint.json, conditions.jsonl, summary.json
    and streams.jsonl, as the report reads them (well under a second for a probe's): bisect would otherwise
    find a bad one only after minutes of model load and replay."""
    if has_header(rd):
        read_header(rd)
    read_fingerprint(rd)
    if rd.exists(CONDITIONS):  # a run without one is refused where conditions are needed (bisect's choice)
        read_conditions(rd)
    read_summary(rd)
    read_streams(rd)


def read_fingerprint(rd: RunDir) -> dict | None:
    """fingerprint.json as an object; None when the run directory has none."""
    return read_document(rd, FINGERPRINT)


def read_document(rd: RunDir, name: str, default=None, lists: tuple[str, ...] = ()):
    """An optional JSON object (fingerprint.json, bisect.json, gate.json); default when absent.
    lists: fields that, when present, must be lists of objects."""
    return document(rd.read_json(name), str(rd.file(name)), lists) if rd.exists(name) else default


# -- what a run directory holds -----------------------------------------------------------

def has_header(rd: RunDir) -> bool:
    """Did a command begin a run here (config.json exists)?"""
    return rd.exists(CONFIG)


def has_streams(rd: RunDir) -> bool:
    """Does the directory hold a run's streams (streams.jsonl)?"""
    return rd.exists(STREAMS)


def has_bisect(rd: RunDir) -> bool:
    """Has `nondet bisect` written its result here (bisect.json)?"""
    return rd.exists(BISECT)


def require_results(rd: RunDir) -> None:
    """RunDirError naming the first of conditions.jsonl, streams.jsonl and summary.json that is missing."""
    for name in (CONDITIONS, STREAMS, SUMMARY):
        if not rd.exists(name):
            raise RunDirError(f"{rd.file(name)}: missing; not a finished probe run (run `nondet probe` first)")


# -- the files as stored, unchecked: for callers that check the fields they use themselves ---------

def read_header_dict(rd: RunDir) -> dict:
    """config.json as stored (bisect reloads the probe's settings from it; --resume its load)."""
    return rd.read_json(CONFIG)


def read_header_document(rd: RunDir, default=None):
    """config.json as an object, its fields unchecked (the report shows what it holds); default when absent."""
    return read_document(rd, CONFIG, default)


def stored_command(rd: RunDir) -> str | None:
    """The command that wrote the run directory ("probe", "rl"); None where it holds no config.json."""
    return read_header_dict(rd).get("command") if has_header(rd) else None


def read_condition_dicts(rd: RunDir) -> list[dict]:
    """conditions.jsonl's records as stored (a torn last line left out, with a PartialRunWarning)."""
    return rd.read_jsonl(CONDITIONS)


def read_stream_dicts(rd: RunDir) -> list[dict]:
    """streams.jsonl's records as stored (a torn last line left out, with a PartialRunWarning)."""
    return rd.read_jsonl(STREAMS)


def read_summary_dict(rd: RunDir) -> dict:
    """summary.json as stored."""
    return rd.read_json(SUMMARY)


# -- what later stages added: bisect, gate ---------------------------------------------------

def read_bisect(rd: RunDir) -> dict | None:
    """bisect.json as an object; None when bisect has not run here."""
    return read_document(rd, BISECT, None, lists=("amplification", "ablation"))


def read_ablation(rd: RunDir) -> dict | None:
    """ablation.json ({"condition_id", "ablation", "minimal_set"}); None when absent."""
    return read_document(rd, ABLATION, None, lists=("ablation",))


def read_bisect_modules(rd: RunDir) -> list[dict[str, str]] | None:
    """bisect_modules.csv's rows as strings; None when absent."""
    return rd.read_csv(BISECT_MODULES) if rd.exists(BISECT_MODULES) else None


def read_gate(rd: RunDir) -> dict | None:
    """gate.json as an object; None when no gate judged this run."""
    return read_document(rd, GATE)
