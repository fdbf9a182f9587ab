"""The run directory: the contract between stages (docs/run-directory.md).

files.py    RunDir: atomic JSON, fsynced JSONL, CSV; the only code that touches the files;
            the files' names (CONFIG, STREAMS, ...): no module outside rundir spells them
records.py  typed records (Header, ConditionRecord, StreamRecord, StepRecord, Summary)
shapes.py   shape checks behind the records: valid JSON of the wrong shape is exit 4
writer.py   RunWriter: the one writer of config.json, fingerprint.json, conditions.jsonl,
            streams.jsonl and summary.json; bisect's, the gate's and the report's files
reader.py   validated reading of those files into records; the files as stored, for callers
            that check their own fields (bisect, --resume)
compare.py  two run directories compared stream by stream, bit for bit (`nondet compare`)
Imports no torch.
"""

from nondet.rundir.files import RunDir, float_to_hex, hex_to_float

__all__ = ["RunDir", "float_to_hex", "hex_to_float"]
