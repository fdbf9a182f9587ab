"""A frozen config dataclass back from its stored form (`dataclasses.asdict`, as config.json keeps it).

Used where a probe's settings travel through a file: a server probe finished with --resume, and the
second process that compiles a later kernels mode's step (probes/static/compile_ahead.py).
"""

from dataclasses import fields, is_dataclass


def from_stored(cls, stored: dict):
    """`cls` from `stored`: a field whose default factory is a dataclass (a ProbeConfig's model and load
    settings) is rebuilt as that class, lists become tuples again; fields `stored` lacks keep their defaults."""
    values = {}
    for f in fields(cls):
        if f.name not in stored:
            continue
        value, factory = stored[f.name], f.default_factory
        if is_dataclass(factory) and isinstance(value, dict):
            value = from_stored(factory, value)
        elif isinstance(value, list):
            value = tuple(value)
        values[f.name] = value
    return cls(**values)
