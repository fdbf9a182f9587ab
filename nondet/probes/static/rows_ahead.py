"""The rows of a kernels mode's conditions, decoded by a second process and handed to the probe through files.

A second process (decode_ahead.py) decodes the mode's conditions from the last one back while the probe
decodes its plan from the front; the two meet in the middle. Who decodes a condition is settled by a claim:
an empty file created with O_EXCL in the exchange's folder, which exactly one process gets. The process that
decoded it writes its rows (a JSON file written aside and renamed into place, so a reader never sees half of
one); the probe, reaching a condition the second process claimed, waits for its rows or, where that process
is gone without them, decodes it here.

Files, not pipes: the second process is a plain `python -m` child (it starts with the probe's model load),
and a claim must hold even where one side dies. Rows are the recorder's step dicts (token ids, floats as
float.hex strings, lists): JSON keeps them exactly; only the row keys (ints) are rebuilt.
"""

import hashlib
import json
import os
from pathlib import Path

CLAIMS = "claims"  # an empty file per claimed condition
ROWS = "rows"  # a JSON file per decoded condition: {target row: [step dict, ...]}


def prepare(folder: Path) -> None:
    """The exchange's folders, before either process claims anything."""
    for name in (CLAIMS, ROWS):
        (folder / name).mkdir(parents=True, exist_ok=True)


def claim(folder: Path, condition_id: str) -> bool:
    """True where this process now owns the condition (it must decode it), False where the other one does."""
    try:
        os.close(os.open(folder / CLAIMS / _file(condition_id), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def put(folder: Path, condition_id: str, rows: dict[int, list[dict]]) -> None:
    """A claimed condition's rows, for the probe to read (written aside, then renamed into place)."""
    final = folder / ROWS / _file(condition_id)
    aside = final.with_suffix(".part")
    aside.write_text(json.dumps({str(row): steps for row, steps in rows.items()}))
    os.replace(aside, final)


def take(folder: Path, condition_id: str) -> dict[int, list[dict]] | None:
    """The condition's rows where the other process has written them, else None."""
    try:
        text = (folder / ROWS / _file(condition_id)).read_text()
    except FileNotFoundError:
        return None
    return {int(row): steps for row, steps in json.loads(text).items()}


def _file(condition_id: str) -> str:
    """A file name for a condition id (which holds '/' and other characters a name may not)."""
    return hashlib.sha256(condition_id.encode()).hexdigest()[:32] + ".json"
