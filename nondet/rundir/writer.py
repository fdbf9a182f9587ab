"""RunWriter: the one writer of a probe's files (config.json, fingerprint.json, conditions.jsonl,
streams.jsonl, summary.json). Sources never write files; the probe loop hands their records here.
The later stages write theirs through the functions at the end: bisect (write_bisect), the gate
(write_gate) and the report (write_figure, write_report_pages).

Records are appended as they arrive (one fsynced line each), so a crash loses nothing already
computed; appends are serialised with a lock because a server source answers from threads.
summary.json is written last: a directory without it is an unfinished run (reader.require_finished).
"""

import os
import threading
from pathlib import Path

from nondet.errors import RunDirError, UsageError
from nondet.rundir.files import (ABLATION, BISECT, BISECT_MODULES, CONDITIONS, CONFIG, FIGURES, FINGERPRINT, GATE,
                                 REPORT_HTML, REPORT_MD, RUN_FILES, STREAMS, SUMMARY, RunDir)
from nondet.rundir.records import FORMAT_VERSION, ConditionRecord, Header, StreamRecord, Summary, to_json


def refuse_a_used_run_dir(path, hint: str = "pass a new --out, or remove it") -> None:
    """A run directory that already holds streams is never written into by a new run: its old
    streams would be diffed against the new ones (another model state, another code version, another
    host), and one comparison must never mix runs. A resumed server probe is the one caller that adds
    to a run directory, and does not call this. A path that cannot become a directory is refused
    here too, before any model loads."""
    if not path:
        return
    check_writable(Path(path))
    if RunDir(path).exists(STREAMS):
        raise UsageError(f"{path} already holds a run; {hint}")
    others = _other_files(Path(path))
    if others:  # the user's own folder: the run's files would land among them
        raise UsageError(f"--out {path} holds other files ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}"
                         "), not a run directory; pass a new or empty folder")


def _other_files(path: Path) -> list[str]:
    """Names in an existing folder that no run writes (hidden ones aside): a run directory left by a refused
    start (config.json alone) is reused, a folder of the user's is not written into."""
    if not path.is_dir():
        return []
    return sorted(p.name for p in path.iterdir() if p.name not in RUN_FILES and not p.name.startswith("."))


def check_writable(path: Path) -> None:
    """UsageError unless `path` is, or can be made, a directory this process may write: the nearest
    part of it that exists must be a directory we may write into (root may write anywhere: then a
    failure can only show when the writer writes, see RunWriter.write_header)."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        what = "is a file" if existing == path else f"lies under {existing}, which is not a directory"
        raise UsageError(f"--out {path} {what}; pass a directory path")
    why = unwritable(existing)
    if why:
        raise UsageError(f"--out {path}: cannot write into {existing} ({why}); pass another path")


WRITES = {"report": f"{REPORT_MD}, {REPORT_HTML} and {FIGURES}/",  # what each later stage writes (for messages)
          "bisect": f"{BISECT}, {BISECT_MODULES} and {ABLATION}"}


def require_writable(rd: RunDir, stage: str) -> None:
    """RunDirError (exit 4) unless this process may write into an existing run directory: a later stage
    (report, bisect: WRITES) writes its files there, and finding that out after its work loses the work.
    Root may write anywhere but on a read-only mount, which os.access reports too."""
    why = unwritable(rd.path)
    if not why:
        return
    raise RunDirError(f"cannot write into {rd.path}: read-only ({why}); `nondet {stage}` writes {WRITES[stage]} "
                      "there: copy the run directory somewhere writable and run it on the copy")


def unwritable(directory: Path) -> str | None:
    """Why this process may not create files in an existing directory ("a read-only file system",
    "permission denied"), or None where it may."""
    if os.access(directory, os.W_OK | os.X_OK):
        return None
    return "a read-only file system" if _read_only_mount(directory) else "permission denied"


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class RunWriter:
    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self._created = False  # write_header made the folder (discard_unstarted may remove it)
        self._reopen()
        self._conditions = {c.get("condition_id") for c in self._existing(CONDITIONS)}

    def _reopen(self) -> None:
        """A resumed run adds to its directory: the record the last run tore is cut off (it is sent
        again), and a summary.json from an earlier finish is removed, since it no longer describes the
        streams; the directory reads as unfinished until write_summary writes a new one, last."""
        for name in (STREAMS, CONDITIONS):
            self.run_dir.cut_torn_tail(name)
        self.run_dir.file(SUMMARY).unlink(missing_ok=True)

    def write_header(self, header: Header, fingerprint: dict) -> None:
        self._created = not self.run_dir.path.exists()  # discard_unstarted removes only a folder it made
        try:
            self.run_dir.path.mkdir(parents=True, exist_ok=True)
            self.run_dir.write_json(CONFIG, to_json(header))
        except OSError as exc:  # the first write: a path the early check could not judge (e.g. a read-only mount)
            raise UsageError(f"cannot write the run directory {self.run_dir.path}: "
                             f"{exc.strerror or exc}; pass another --out") from None
        self.run_dir.write_json(FINGERPRINT, fingerprint)

    def discard_unstarted(self) -> None:
        """A start refused after the header was written (a usage error found once the model and tokenizer
        loaded): no condition ran, so the header's two files go, and the folder if this run made it; a
        directory holding any condition or stream is left as it is."""
        if self.run_dir.exists(CONDITIONS) or self.run_dir.exists(STREAMS):
            return
        for name in (CONFIG, FINGERPRINT):
            self.run_dir.file(name).unlink(missing_ok=True)
        if self._created and not any(self.run_dir.path.iterdir()):
            self.run_dir.path.rmdir()

    def append_to_header(self, key: str, entry: dict) -> None:
        """Add an entry to a list field of config.json (e.g. "resumes"), keeping the rest."""
        with self._lock:
            stored = self.run_dir.read_json(CONFIG)
            stored[key] = list(stored.get(key) or []) + [entry]
            self.run_dir.write_json(CONFIG, stored)

    def update_fingerprint(self, update) -> None:
        """Apply update(fingerprint dict) and store it (e.g. a server's identity, learnt late)."""
        with self._lock:
            fp = self.run_dir.read_json(FINGERPRINT)
            update(fp)
            self.run_dir.write_json(FINGERPRINT, fp)

    def append_condition(self, record: ConditionRecord) -> None:
        """Once per condition id: a resumed run does not repeat the conditions already on disk."""
        with self._lock:
            if record.condition_id in self._conditions:
                return
            self._conditions.add(record.condition_id)
            self.run_dir.append_jsonl(CONDITIONS, to_json(record))

    def append_stream(self, record: StreamRecord) -> dict:
        line = to_json(record)
        with self._lock:
            self.run_dir.append_jsonl(STREAMS, line)
        return line

    def write_summary(self, summary: Summary) -> dict:
        """Written last: its presence marks the run finished (reader.require_finished)."""
        doc = to_json(summary)
        self.run_dir.write_json(SUMMARY, doc)
        return doc

    def _existing(self, name: str) -> list:
        return self.run_dir.read_jsonl(name) if self.run_dir.exists(name) else []


def new_header(command: str, config: dict, argv) -> Header:
    from nondet import __version__

    return Header(command=command, config=config, argv=list(argv), nondet_version=__version__,
                  format_version=FORMAT_VERSION)


def write_bisect(rd: RunDir, result: dict, rows: list[dict], fieldnames: list[str]) -> None:
    """bisect_modules.csv (rows), bisect.json (result) and ablation.json: the result's ablation again,
    on its own (readers prefer it)."""
    rd.write_csv(BISECT_MODULES, rows, fieldnames)
    rd.write_json(BISECT, result)
    rd.write_json(ABLATION, {"condition_id": result["condition_id"], "ablation": result["ablation"],
                             "minimal_set": result["minimal_set"]})


def write_gate(rd: RunDir, verdict: dict) -> Path:
    """gate.json: the policy's verdict on this run (the report shows it)."""
    return rd.write_json(GATE, verdict)


def write_figure(rd: RunDir, name: str, svg: bytes) -> Path:
    """One of the report's figures (SVG text, UTF-8), under figures/."""
    return rd.write_bytes(f"{FIGURES}/{name}", svg)


def write_report_pages(rd: RunDir, markdown: str, html: str) -> tuple[Path, Path]:
    """report.md (its figures linked under figures/) and report.html; returns their paths."""
    return rd.write_text(REPORT_MD, markdown), rd.write_text(REPORT_HTML, html)
