"""Shape checks behind the typed records (records.py): before any value reaches the diff,
pandas or a renderer.

Valid JSON of the wrong shape (a list where a document belongs, a number where a kernels
name belongs) is a bad run directory: RunDirError naming the file, the record and the
field, never an internal error or a silently rendered wrong value.
"""

from nondet.errors import RunDirError

STR, INT, BOOL, LIST, DICT = (str,), (int,), (bool,), (list,), (dict,)
OPT_STR, OPT_INT, OPT_LIST = (str, type(None)), (int, type(None)), (list, type(None))
# a record type's fields -> allowed types live beside it (records.py: TYPES / OPTIONAL)


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


def check_float_hex(where: str, name: str, value) -> None:
    """A float stored bit for bit (float.hex) must parse, here, not later in a renderer."""
    if value is None:
        return
    try:
        float.fromhex(value)
    except (TypeError, ValueError):
        raise RunDirError(f"{where}: field {name!r} must be a float.hex() string, found {value!r:.40}") from None


def check_top(where: str, top) -> None:
    """top: [[token, float.hex logprob], ...]."""
    for entry in top or ():
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int)):
            raise RunDirError(f"{where}: field 'top' must hold [token, logprob] pairs, found {entry!r:.40}")
        check_float_hex(where, "top", entry[1])


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
