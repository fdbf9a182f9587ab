"""Run directory -> pandas DataFrames, for the report and for notebook users.

    from nondet.reports import read_tables
    t = read_tables("runs/2026-11-22T0300")
    t.streams.groupby("condition_id").logprob.std()
"""

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from nondet.errors import RunDirError
from nondet.rundir import RunDir, hex_to_float, reader
from nondet.rundir.files import SUMMARY
from nondet.rundir.records import to_json

STREAM_COLUMNS = ["run_id", "condition_id", "kernels", "position", "is_reference", "step", "token", "piece",
                  "logprob", "logprob_hex", "margin", "margin_hex", "top_ids", "top_logprobs"]
RUN_COLUMNS = ["run_id", "condition_id", "kernels", "position", "is_reference", "batch_size", "load",
               "prompt_tokens", "finish", "n_steps", "text", "completion_id",
               "first_token_divergence", "first_numeric_divergence"]
CONDITION_COLUMNS = ["condition_id", "kernels", "load", "batch_size", "positions", "fillers", "label",
                     "n_runs", "distinct_completions", "first_token_divergence", "first_numeric_divergence"]
COMPLETION_COLUMNS = ["kernels", "completion_id", "count", "is_reference", "n_tokens", "text", "tokens"]
MODULE_COLUMNS = ["step", "order", "layer", "module", "op_class", "max_abs_diff", "max_rel_diff", "max_ulp",
                  "first_diff_index", "differs"]
ABLATION_COLUMNS = ["ops", "tokens_match", "activations_match", "first_token_divergence", "first_numeric_step",
                    "first_diff", "origin_removed", "lasting"]  # first_diff: first differing point under this ablation
#                   ({"step", "module", "op_class", "layer"} or None); origin_removed: the origin point is
#                   bit-identical under this ablation; lasting: where the lasting divergence is born under it
AMPLIFICATION_COLUMNS = ["step", "layer", "max_abs_diff"]
RL_COLUMNS = ["kernels", "sampler", "trainer_condition", "micro_batch", "padding", "backward", "grad_finite",
              "n_tokens", "n_identical", "frac_identical", "bit_identical", "dlogp_max", "dlogp_mean", "dlogp_p95",
              "ratio_out_0.1", "ratio_out_0.2", "kl_k1", "kl_k2", "kl_k3", "kl_exact", "kl_exact_max", "seqs_differ"]
#             one row per sampler/trainer pair of a `nondet rl` run (summary.json "rl" pairs; nondet/rl/compare.py):
#             bit_identical: every sampled token's logprob bits equal; ratio_out_E: fraction of importance
#             ratios outside [1-E, 1+E]; kl_k1/k2/k3: Schulman's KL(sampler || trainer) estimators;
#             kl_exact / kl_exact_max: mean / max per-token KL over the whole distributions (NaN: rollouts)
_NULLABLE_INT = ["first_token_divergence", "first_numeric_divergence", "first_numeric_step", "completion_id",
                 "layer", "first_diff_index", "batch_size", "n_runs", "distinct_completions", "prompt_tokens"]
_MODEL_TEXT = ["piece", "text"]  # model text: may hold raw bytes as lone surrogates


@dataclass
class RunTables:
    """Everything in one run directory. Tables are DataFrames (empty, with their columns,
    when the stage that writes them has not run); raw JSON documents are dicts."""

    path: Path
    config: dict                    # config.json ({} when absent)
    fingerprint: dict               # fingerprint.json ({} when absent)
    summary: dict                   # summary.json: the probe's diff (modes, verdict)
    streams: pd.DataFrame           # one row per (run, step): STREAM_COLUMNS
    runs: pd.DataFrame              # one row per run: RUN_COLUMNS
    conditions: pd.DataFrame        # one row per condition: CONDITION_COLUMNS
    completions: pd.DataFrame       # one row per (kernels mode, distinct completion): COMPLETION_COLUMNS
    bisect: dict | None = None      # bisect.json, None before `nondet bisect`
    bisect_modules: pd.DataFrame = field(default_factory=lambda: _frame([], MODULE_COLUMNS))
    amplification: pd.DataFrame = field(default_factory=lambda: _frame([], AMPLIFICATION_COLUMNS))
    ablation: pd.DataFrame = field(default_factory=lambda: _frame([], ABLATION_COLUMNS))
    minimal_set: list[str] | None = None  # smallest op-class set whose ablation removes the divergence
    gate: dict | None = None        # gate.json, None unless `nondet gate` wrote this run
    rl: pd.DataFrame = field(default_factory=lambda: _frame([], RL_COLUMNS))  # `nondet rl` runs: RL_COLUMNS
    partial: str = ""  # what was left out of a torn JSONL file ("" when every record was read)

    @property
    def is_rl(self) -> bool:
        """A `nondet rl` run: sampler and trainer streams, the metrics in `rl`, no probe modes."""
        return "rl" in self.summary

    @property
    def modes(self) -> dict:
        return self.summary.get("modes", {})

    @property
    def primary_mode(self) -> str:
        """The mode the verdict is about: "default" when the run has it."""
        return "default" if "default" in self.modes else next(iter(self.modes), "default")


def read_tables(path) -> RunTables:
    """Read a run directory into DataFrames; RunDirError if it is missing or malformed."""
    rd = RunDir(path)
    reader.require_finished(rd)
    reader.require_results(rd)
    summary = to_json(reader.read_summary(rd))  # each record validated: a wrong shape is exit 4
    if not summary["modes"] and "rl" not in summary:  # an rl run has pairs instead of modes
        raise RunDirError(f"{rd.file(SUMMARY)}: has no 'modes'; rerun `nondet probe`")
    raw_streams = [to_json(s) for s in reader.read_streams(rd)]
    raw_conditions = [to_json(c) for c in reader.read_conditions(rd)]
    try:
        tables = RunTables(
            path=rd.path, config=reader.read_header_document(rd, {}), fingerprint=reader.read_fingerprint(rd) or {},
            summary=summary, streams=_streams(raw_streams), runs=_runs(raw_streams, raw_conditions, summary),
            conditions=_conditions(raw_conditions, summary), completions=_completions(summary),
            rl=_rl(summary), partial=reader.torn_records(rd))
        _add_bisect(rd, tables)
        _add_gate(rd, tables)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RunDirError(f"{rd.path}: malformed run directory ({type(exc).__name__}: {exc})") from exc
    return tables


def _frame(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({col: _column(col, [r.get(col) for r in rows]) for col in columns}, columns=columns)


def _column(name: str, values: list) -> pd.Series | pd.api.extensions.ExtensionArray:
    """One column with its dtype: nullable ints, model text kept as Python str, the rest inferred."""
    if name in _NULLABLE_INT:
        return pd.array([None if v is None or pd.isna(v) else int(v) for v in values], dtype="Int64")
    if name in _MODEL_TEXT:
        # object, not pandas' str dtype: with pyarrow installed pandas 3 backs str columns with
        # Arrow, which rejects the lone surrogates that hold a partial UTF-8 token's raw bytes.
        return pd.Series(values, dtype=object)
    return pd.Series(values, dtype=None if values else object)


def _streams(raw: list[dict]) -> pd.DataFrame:
    rows = []
    for r in raw:
        for i, s in enumerate(r["steps"]):
            top = s.get("top") or []
            rows.append({"run_id": r["run_id"], "condition_id": r["condition_id"], "kernels": r["kernels"],
                         "position": r["position"], "is_reference": bool(r["is_reference"]), "step": i,
                         "token": s["token"], "piece": s.get("piece", ""),
                         "logprob": hex_to_float(s.get("logprob")), "logprob_hex": s.get("logprob"),
                         "margin": hex_to_float(s.get("margin")), "margin_hex": s.get("margin"),
                         "top_ids": [t[0] for t in top], "top_logprobs": [hex_to_float(t[1]) for t in top]})
    return _frame(rows, STREAM_COLUMNS)


def _runs(raw: list[dict], conditions: list[dict], summary: dict) -> pd.DataFrame:
    by_cond = {c["condition_id"]: c for c in conditions}
    diff = {r["run_id"]: r for m in summary["modes"].values() for r in m.get("runs", [])}
    rows = []
    for r in raw:
        c, d = by_cond.get(r["condition_id"], {}), diff.get(r["run_id"], {})
        rows.append({"run_id": r["run_id"], "condition_id": r["condition_id"], "kernels": r["kernels"],
                     "position": r["position"], "is_reference": bool(r["is_reference"]),
                     "batch_size": c.get("batch_size"), "load": c.get("load"),
                     "prompt_tokens": r.get("prompt_tokens"), "finish": r.get("finish"),
                     "n_steps": len(r["steps"]), "text": r.get("text", ""),
                     "completion_id": d.get("completion_id"),
                     "first_token_divergence": d.get("first_token_divergence"),
                     "first_numeric_divergence": d.get("first_numeric_divergence")})
    return _frame(rows, RUN_COLUMNS)


def _conditions(raw: list[dict], summary: dict) -> pd.DataFrame:
    diff = {c["condition_id"]: c for m in summary["modes"].values() for c in m.get("conditions", [])}
    rows = []
    for c in raw:
        d = diff.get(c["condition_id"], {})
        rows.append({**{k: c.get(k) for k in CONDITION_COLUMNS[:7]},
                     **{k: d.get(k) for k in CONDITION_COLUMNS[7:]}})
    return _frame(rows, CONDITION_COLUMNS)


def _completions(summary: dict) -> pd.DataFrame:
    rows = [{"kernels": mode, "completion_id": c["completion_id"], "count": c["count"],
             "is_reference": bool(c.get("is_reference")), "n_tokens": len(c.get("tokens") or []),
             "text": c.get("text", ""), "tokens": c.get("tokens") or []}
            for mode, m in summary["modes"].items() for c in m.get("completions", [])]
    return _frame(rows, COMPLETION_COLUMNS)


def _rl(summary: dict) -> pd.DataFrame:
    rows = [{**{k: p.get(k) for k in RL_COLUMNS}, "ratio_out_0.1": p.get("ratio_outside_0.1"),
             "ratio_out_0.2": p.get("ratio_outside_0.2"),
             "bit_identical": bool(p.get("n_tokens")) and p.get("n_identical") == p.get("n_tokens")}
            for p in (summary.get("rl") or {}).get("pairs", [])]
    frame = _frame(rows, RL_COLUMNS)
    for col in ("micro_batch", "n_tokens", "n_identical", "seqs_differ"):  # counts; None where no token was kept
        frame[col] = pd.array([None if v is None else int(v) for v in (r[col] for r in rows)], dtype="Int64")
    return frame


def _add_gate(rd: RunDir, t: RunTables) -> None:
    t.gate = reader.read_gate(rd)


def _add_bisect(rd: RunDir, t: RunTables) -> None:
    bisect, modules, ablation = reader.read_bisect(rd), reader.read_bisect_modules(rd), reader.read_ablation(rd)
    if bisect is not None:
        t.bisect = bisect
        t.amplification = _frame(t.bisect.get("amplification") or [], AMPLIFICATION_COLUMNS)
    if modules is not None:
        t.bisect_modules = _modules(modules)
    if ablation is None:  # before ablation.json was written, bisect.json alone held the ablation
        ablation = t.bisect or {}
    t.ablation = _frame(ablation.get("ablation") or [], ABLATION_COLUMNS)
    t.minimal_set = ablation.get("minimal_set")


def _modules(rows: list[dict[str, str]]) -> pd.DataFrame:
    def num(v, kind=float):
        return None if v in ("", None) else kind(float(v))

    out = [{"step": int(r["step"]), "order": int(r["order"]), "layer": num(r.get("layer"), int),
            "module": r["module"], "op_class": r["op_class"] or "other",
            "max_abs_diff": num(r.get("max_abs_diff")), "max_rel_diff": num(r.get("max_rel_diff")),
            "max_ulp": num(r.get("max_ulp")), "first_diff_index": num(r.get("first_diff_index"), int),
            "differs": str(r.get("differs", "")).strip().lower() in ("true", "1", "yes")} for r in rows]
    return _frame(out, MODULE_COLUMNS)
