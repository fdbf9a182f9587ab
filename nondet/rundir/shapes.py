"""Shape checks for run-directory records before they reach pandas or a renderer.

Valid JSON of the wrong shape (a list where a document belongs, a number where a kernels
name belongs) is a bad run directory: RunDirError naming the file, the record and the
field, never an internal error or a silently rendered wrong value.
"""

from nondet.errors import RunDirError

STR, INT, BOOL, LIST, DICT = (str,), (int,), (bool,), (list,), (dict,)
OPT_STR, OPT_INT, OPT_LIST = (str, type(None)), (int, type(None)), (list, type(None))

# field -> allowed types; a field missing from a record is an error only when required
CONDITION_FIELDS = {"condition_id": STR, "kernels": STR, "batch_size": OPT_INT, "positions": OPT_LIST,
                    "fillers": STR}
CONDITION_OPTIONAL = {"label": STR, "load": STR}
STREAM_FIELDS = {"run_id": INT, "condition_id": STR, "kernels": STR, "position": OPT_INT,
                 "is_reference": BOOL, "steps": LIST}
STREAM_OPTIONAL = {"text": STR, "finish": OPT_STR, "prompt_tokens": OPT_INT}
STEP_FIELDS = {"token": INT}
STEP_OPTIONAL = {"piece": STR, "logprob": OPT_STR, "margin": OPT_STR, "top": (list, type(None))}


def check_records(file: str, records: list, required: dict, optional: dict | None = None) -> None:
    """Every record is an object whose fields have the allowed types."""
    for i, record in enumerate(records, start=1):
        where = f"{file}: record {i}"
        check_fields(where, record, required, optional or {})


def check_streams(file: str, records: list) -> None:
    check_records(file, records, STREAM_FIELDS, STREAM_OPTIONAL)
    for i, record in enumerate(records, start=1):
        for k, step in enumerate(record["steps"]):
            check_fields(f"{file}: record {i}, step {k}", step, STEP_FIELDS, STEP_OPTIONAL)


def check_document(file: str, doc, lists: tuple[str, ...] = ()) -> dict:
    """A JSON document must be an object; the named fields, when present, lists of objects."""
    if not isinstance(doc, dict):
        raise RunDirError(f"{file}: expected a JSON object, found {_kind(doc)}")
    for name in lists:
        value = doc.get(name)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise RunDirError(f"{file}: field {name!r} must be a list of objects, found {_kind(value)}")
    return doc


def check_fields(where: str, record, required: dict, optional: dict) -> None:
    if not isinstance(record, dict):
        raise RunDirError(f"{where}: expected a JSON object, found {_kind(record)}")
    for name, types in required.items():
        if name not in record:
            raise RunDirError(f"{where}: missing field {name!r}")
        _check_type(where, name, record[name], types)
    for name, types in optional.items():
        if name in record:
            _check_type(where, name, record[name], types)


def _check_type(where: str, name: str, value, types: tuple) -> None:
    # bool is an int in Python; an int field must not accept true/false, nor a bool field 0/1
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        wanted = " or ".join("null" if t is type(None) else _JSON_NAMES[t] for t in types)
        raise RunDirError(f"{where}: field {name!r} must be {wanted}, found {_kind(value)} {value!r:.40}")


_JSON_NAMES = {str: "a string", int: "an integer", bool: "true/false", list: "a list", dict: "an object"}


def _kind(value) -> str:
    if value is None:
        return "null"
    return {bool: "true/false", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)
