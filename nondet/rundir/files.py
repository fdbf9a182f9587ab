"""The run directory: the only module that reads or writes its files (docs/run-directory.md).

JSON is written with `ensure_ascii=True`, so model text survives exactly, including lone
surrogates (bytes that were not valid UTF-8, decoded with "surrogateescape") and control
characters. JSONL lines are flushed and fsynced one by one, so a crash loses at most the
line being written; a reader leaves such a torn last line out and warns (PartialRunWarning),
or refuses it where a comparison needs every record. Imports no torch.
"""

import csv
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any, Iterable

from nondet.errors import PartialRunWarning, RunDirError

# The run directory's files (docs/run-directory.md). Only nondet/rundir names them: every other
# stage reads and writes them through reader.py and writer.py (tests/test_layout.py checks it).
CONFIG = "config.json"  # Header: the command, its frozen config, argv, versions
FINGERPRINT = "fingerprint.json"  # the environment
CONDITIONS = "conditions.jsonl"  # one ConditionRecord a line
STREAMS = "streams.jsonl"  # one StreamRecord a line
SUMMARY = "summary.json"  # the diff; written last, so its presence marks a finished run
BISECT = "bisect.json"  # `nondet bisect`: attribution and ablation
BISECT_MODULES = "bisect_modules.csv"  # `nondet bisect`: one row per (step, captured point)
ABLATION = "ablation.json"  # `nondet bisect`: the ablation again, on its own
GATE = "gate.json"  # `nondet gate`: the policy's verdict
REPORT_MD = "report.md"  # `nondet report`
REPORT_HTML = "report.html"  # `nondet report`, self-contained
FIGURES = "figures"  # `nondet report`: the folder of report.md's SVG figures
RUN_FILES = (CONFIG, FINGERPRINT, CONDITIONS, STREAMS, SUMMARY, BISECT, BISECT_MODULES, ABLATION, GATE,
             REPORT_MD, REPORT_HTML, FIGURES)
# torn records already warned about, as (path, line, file size): one command reads a file more than once
# (bisect checks it, replays from it, then reports it), and a torn record is one warning line, not one a read
_WARNED: set[tuple[str, int, int]] = set()


class RunDir:
    """A run directory on disk. Creating the object touches nothing; writers create it."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def file(self, name: str) -> Path:
        return self.path / name

    def exists(self, name: str) -> bool:
        return self.file(name).is_file()

    def require(self) -> None:
        """Raise RunDirError unless the directory exists."""
        if self.path.is_file():  # "not found" would send the user looking for a path that is there
            raise RunDirError(f"{self.path} is a file, not a run directory (pass the directory `nondet probe` "
                              "wrote)")
        if not self.path.is_dir():
            raise RunDirError(f"run directory not found: {self.path} (create one with `nondet probe`)")

    # -- JSON ---------------------------------------------------------------------------

    def write_json(self, name: str, obj: Any) -> Path:
        """Write one JSON document atomically (temp file, fsync, rename)."""
        return self.write_text(name, json.dumps(obj, indent=2, ensure_ascii=True) + "\n")

    def read_json(self, name: str) -> Any:
        text = self.read_text(name)
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise RunDirError(f"{self.file(name)}: malformed JSON at line {exc.lineno}: {exc.msg}") from None

    # -- JSONL --------------------------------------------------------------------------

    def append_jsonl(self, name: str, obj: Any) -> None:
        """Append one record as one line, flushed and fsynced before returning."""
        line = json.dumps(obj, ensure_ascii=True, separators=(",", ":")) + "\n"
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.file(name), "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def read_jsonl(self, name: str) -> list[Any]:
        """All records. A torn last line (a crash) is left out, with a PartialRunWarning naming it."""
        return [record for _, record in self.read_jsonl_lines(name)]

    def read_jsonl_lines(self, name: str, whole: bool = False) -> list[tuple[int, Any]]:
        """(line number, record) for every record. A torn last line (no newline, not parseable: the
        write was cut off) is left out with a PartialRunWarning, or with whole=True refused."""
        lines = self.read_text(name).split("\n")
        records = []
        for i, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                records.append((i, json.loads(line)))
            except json.JSONDecodeError as exc:
                if i < len(lines):  # a whole line (a newline follows it) that is not JSON
                    raise RunDirError(f"{self.file(name)}:{i}: malformed JSON: {exc.msg}") from None
                self._torn(name, i, whole)
        return records

    def _torn(self, name: str, line: int, whole: bool) -> None:
        where = f"{self.file(name)}:{line}"
        if whole:
            raise RunDirError(f"{where}: record cut off mid-write (the run was interrupted or the file "
                              "truncated); this needs the whole run directory")
        seen = (os.path.abspath(self.file(name)), line, self.file(name).stat().st_size)
        if seen in _WARNED:
            return
        _WARNED.add(seen)
        warnings.warn(PartialRunWarning(f"{where}: record cut off mid-write, left out; what is read from "
                                        f"{self.path} is partial"), stacklevel=3)

    def torn_line(self, name: str) -> int | None:
        """The number of a torn last line of a JSONL file (see read_jsonl_lines), else None."""
        if not self.exists(name):
            return None
        text = self.read_text(name)
        if text.endswith("\n") or not text.strip():
            return None
        last = text.rsplit("\n", 1)[-1]
        try:
            json.loads(last)
        except json.JSONDecodeError:
            return text.count("\n") + 1
        return None

    def blank(self, name: str) -> bool:
        """True for a file holding nothing but whitespace; read only up to its first other byte."""
        with open(self.file(name), "rb") as f:
            while chunk := f.read(1 << 16):
                if chunk.strip():
                    return False
        return True

    def cut_torn_tail(self, name: str) -> None:
        """Drop a torn last line, so records appended after it (a resumed run) start on a line of their own."""
        if self.torn_line(name) is None:
            return
        data = self.file(name).read_bytes()
        with open(self.file(name), "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)

    # -- CSV ----------------------------------------------------------------------------

    def write_csv(self, name: str, rows: Iterable[dict], fieldnames: list[str]) -> Path:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fieldnames, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in fieldnames})
        return self.write_text(name, buf.getvalue())

    def read_csv(self, name: str) -> list[dict[str, str]]:
        """Rows as dicts of strings (empty string = missing)."""
        text = self.read_text(name)
        try:
            return list(csv.DictReader(io.StringIO(text)))
        except csv.Error as exc:
            raise RunDirError(f"{self.file(name)}: malformed CSV: {exc}") from None

    # -- raw text and bytes -------------------------------------------------------------

    def read_text(self, name: str) -> str:
        path = self.file(name)
        if not path.is_file():
            self.require()
            raise RunDirError(f"{path}: missing from the run directory")
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise RunDirError(f"{path}: not UTF-8 (byte {exc.start})") from None

    def write_text(self, name: str, text: str) -> Path:
        return self.write_bytes(name, text.encode("utf-8"))

    def write_bytes(self, name: str, data: bytes) -> Path:
        """Write a whole file atomically; creates the directory and subfolders."""
        path = self.file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path


def hex_to_float(s: str | None) -> float | None:
    """`float.fromhex` for stored bit-exact floats; None stays None."""
    if s is None:
        return None
    try:
        return float.fromhex(s)
    except (TypeError, ValueError):
        raise RunDirError(f"not a float.hex() string: {s!r}") from None


def float_to_hex(x: float | None) -> str | None:
    """The stored form of a float that must compare bitwise; None stays None."""
    return None if x is None else float(x).hex()
