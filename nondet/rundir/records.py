"""Typed records of a run directory (docs/run-directory.md), and their JSON form.

Records are what the probe writes and every later stage reads: Header (config.json),
ConditionRecord (conditions.jsonl), StreamRecord with its StepRecords (streams.jsonl) and
Summary (summary.json). `from_json` validates shape and types, so valid JSON of the wrong
shape is a RunDirError naming the file, the record and the field (exit 4), never a crash
later or a silently rendered wrong value. `to_json` gives the on-disk dict; fields a source
adds beyond the typed ones (the server's request_id, the engine's batch_requests) travel in
`extra` and are written beside them. Imports no torch.
"""

from dataclasses import dataclass, field, fields

from nondet.rundir.shapes import (BOOL, DICT, INT, LIST, OPT_INT, OPT_LIST, OPT_STR, STR, check_document,
                                  check_fields, check_float_hex, check_top)

FORMAT_VERSION = 2  # 1: before typed records (no format_version field); 2: prompt_id, format_version


@dataclass(frozen=True)
class StepRecord:
    token: int  # the token chosen at this step
    piece: str = ""  # its text; bytes that are not UTF-8 as lone surrogates (surrogateescape)
    logprob: str | None = None  # float.hex of the chosen token's logprob (None: the source gave none)
    margin: str | None = None  # float.hex of top1 - top2 logit (None: unknown)
    top: list | None = None  # [[token, float.hex logprob], ...] best first
    extra: dict = field(default_factory=dict)

    TYPES = {"token": INT}
    OPTIONAL = {"piece": STR, "logprob": OPT_STR, "margin": OPT_STR, "top": OPT_LIST}


@dataclass(frozen=True)
class StreamRecord:
    run_id: int  # unique in the run directory
    condition_id: str
    kernels: str  # "default" | "batch-invariant"
    position: int | None  # the target's row in its batch (None where a source has no rows)
    is_reference: bool  # the prompt alone: what every run of its prompt is compared with
    steps: list  # StepRecord, one per generated token
    prompt_id: int = 0  # which target prompt (index into config.json's prompts)
    prompt_tokens: int | None = None
    finish: str | None = None  # "length" | "eos" | "empty" | a server's finish_reason
    text: str = ""
    extra: dict = field(default_factory=dict)

    TYPES = {"run_id": INT, "condition_id": STR, "kernels": STR, "position": OPT_INT, "is_reference": BOOL,
             "steps": LIST}
    OPTIONAL = {"prompt_id": INT, "prompt_tokens": OPT_INT, "finish": OPT_STR, "text": STR}


@dataclass(frozen=True)
class ConditionRecord:
    condition_id: str  # "<kernels>/[p<k>/]bs<B>/<placement>", "<kernels>/cb/run<r>", "default/server/burst"
    kernels: str
    batch_size: int | None  # None where a source has no fixed batch
    positions: list | None  # rows holding the target
    fillers: str  # none | same-length | copies | ragged | poisson
    label: str = ""
    load: str = "static"  # the source: static | continuous | server
    prompt_id: int = 0
    extra: dict = field(default_factory=dict)

    TYPES = {"condition_id": STR, "kernels": STR, "batch_size": OPT_INT, "positions": OPT_LIST, "fillers": STR}
    OPTIONAL = {"label": STR, "load": STR, "prompt_id": INT}


@dataclass(frozen=True)
class Header:
    command: str  # the command that made the run directory ("probe")
    config: dict  # the command's frozen config, asdict()
    argv: list = field(default_factory=list)
    nondet_version: str = ""
    format_version: int = 1  # absent on disk = 1 (written before this field existed)
    extra: dict = field(default_factory=dict)  # e.g. "resumes" of a server probe

    TYPES = {"command": STR, "config": DICT}
    OPTIONAL = {"argv": LIST, "nondet_version": STR, "format_version": INT}


@dataclass(frozen=True)
class Summary:
    modes: dict  # kernels mode -> the diff (probes/core/diff.py: summarize / merge_prompts)
    verdict: str = ""
    extra: dict = field(default_factory=dict)  # e.g. "load": the source's settings and notes

    TYPES = {"modes": DICT}
    OPTIONAL = {"verdict": STR}
    MODE_TYPES = {"n_runs": INT, "distinct_completions": INT, "runs": LIST, "conditions": LIST}
    MODE_OPTIONAL = {"completions": LIST, "first_token_divergence": OPT_INT, "first_numeric_divergence": OPT_INT,
                     "reference_run_id": INT, "branch_tree": (dict, type(None)), "prompts": LIST}


def to_json(record) -> dict:
    """The on-disk dict: typed fields (steps as dicts), then the extras."""
    out = {}
    for f in fields(record):
        if f.name == "extra":
            continue
        value = getattr(record, f.name)
        out[f.name] = [to_json(s) if isinstance(s, StepRecord) else s for s in value] if f.name == "steps" else value
    return {**out, **record.extra}


def from_json(cls, data, where: str):
    """A record of type cls from its dict; RunDirError (where: file and record) if the shape is wrong."""
    check_fields(where, data, cls.TYPES, cls.OPTIONAL)
    known = {f.name for f in fields(cls)} - {"extra"}
    values = {k: v for k, v in data.items() if k in known}
    extra = {k: v for k, v in data.items() if k not in known}
    if cls is StepRecord:  # the floats compared bit for bit must parse: a bad one names its record
        check_float_hex(where, "logprob", data.get("logprob"))
        check_float_hex(where, "margin", data.get("margin"))
        check_top(where, data.get("top"))
    if cls is StreamRecord:
        values["steps"] = [from_json(StepRecord, s, f"{where}, step {i}") for i, s in enumerate(data["steps"])]
    if cls is Summary:
        for name, mode in data["modes"].items():
            check_fields(f"{where}, mode {name!r}", mode, Summary.MODE_TYPES, Summary.MODE_OPTIONAL)
    return cls(**values, extra=extra)


def document(data, where: str, lists: tuple[str, ...] = ()) -> dict:
    """A JSON document that must be an object (bisect.json, gate.json, fingerprint.json)."""
    return check_document(where, data, lists)


__all__ = ["FORMAT_VERSION", "StepRecord", "StreamRecord", "ConditionRecord", "Header", "Summary", "to_json",
           "from_json", "document", "BOOL", "INT", "STR", "LIST", "OPT_INT", "OPT_LIST", "OPT_STR", "DICT"]
