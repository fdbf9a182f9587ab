"""Validated reading of a probe's run directory into typed records.

Every file is checked against its record type (records.py): a record of the wrong shape is
a RunDirError naming the file, the record number and the field. Run directories written
before typed records (format 1: no format_version, no prompt_id) read the same way; a
format newer than this nondet knows is refused with a line naming both versions.
"""

from nondet.errors import RunDirError
from nondet.rundir.files import RunDir
from nondet.rundir.records import (FORMAT_VERSION, ConditionRecord, Header, StreamRecord, Summary, document,
                                   from_json)


def read_header(rd: RunDir) -> Header:
    header = from_json(Header, rd.read_json("config.json"), str(rd.file("config.json")))
    if header.format_version > FORMAT_VERSION:
        raise RunDirError(f"{rd.file('config.json')}: run directory format {header.format_version} is newer than "
                          f"this nondet reads ({FORMAT_VERSION}); upgrade nondet")
    return header


def read_conditions(rd: RunDir) -> list[ConditionRecord]:
    name = str(rd.file("conditions.jsonl"))
    return [from_json(ConditionRecord, c, f"{name}: record {i}")
            for i, c in enumerate(rd.read_jsonl("conditions.jsonl"), start=1)]


def read_streams(rd: RunDir) -> list[StreamRecord]:
    name = str(rd.file("streams.jsonl"))
    return [from_json(StreamRecord, s, f"{name}: record {i}")
            for i, s in enumerate(rd.read_jsonl("streams.jsonl"), start=1)]


def read_summary(rd: RunDir) -> Summary:
    return from_json(Summary, rd.read_json("summary.json"), str(rd.file("summary.json")))


def read_document(rd: RunDir, name: str, default=None, lists: tuple[str, ...] = ()):
    """An optional JSON object (fingerprint.json, bisect.json, gate.json); default when absent.
    lists: fields that, when present, must be lists of objects."""
    return document(rd.read_json(name), str(rd.file(name)), lists) if rd.exists(name) else default
