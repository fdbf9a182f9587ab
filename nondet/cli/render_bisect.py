"""`nondet bisect`'s terminal output: the origin, the lasting divergence, the modules that differ per step,
and the ablation's minimal set (nondet/cli/bisect.py runs it; reports/bisect_sections.py is the report's)."""

TABLE_ROWS = 12  # differing modules shown per step; bisect_modules.csv holds them all


def print_partial(run_dir, console) -> None:
    """A bisect over a run directory a crash tore: it chose its condition from the records before the tear."""
    from nondet.rundir import RunDir
    from nondet.rundir.reader import torn_records

    partial = torn_records(RunDir(run_dir))
    if partial:
        console.print(f"partial: {partial}; the condition was chosen from the records before it",
                      style="yellow", markup=False, highlight=False)


def print_bisect(b: dict, modules: list[dict], console) -> None:
    from functools import partial

    from rich.text import Text

    from nondet.cli.fit import fitted
    from nondet.verdict import replay_line, routing_line

    if "routing" in b:  # a mixture of experts: did the tokens go to other experts? (before any op detail)
        console.print(Text(routing_line(b["routing"], b["steps"]), style="bold"))
    console.print(_origin_line(b))
    if b.get("rl"):
        console.print(_rl_line(b["rl"]))
    replayed = replay_line(b)
    if replayed:
        console.print(f"warning: {replayed}", style="yellow")
    steps = _table_steps(b)
    for step in steps:
        console.print(fitted(console, partial(_modules_table, step, b, modules),
                             partial(_modules_table, step, b, modules, narrow=True)))
    if steps and b["amplification"]:
        console.print(_amplification_line(b["amplification"], steps))
    if b.get("ablation"):
        console.print(fitted(console, partial(_ablation_table, b["ablation"]),
                             partial(_ablation_table, b["ablation"], narrow=True)))
        minimal = b.get("minimal_set")
        console.print(Text("minimal set that removes the divergence: "
                           + (" + ".join(minimal) if minimal else "none found"), style="bold"))
        if b.get("rl"):
            equal = [" + ".join(e["ops"]) for e in b["ablation"] if e.get("logprobs_match")]
            console.print("every logprob bit-identical (KL exactly 0) with batch-invariant: "
                          + (", ".join(equal) if equal else "none of these"))
    elif b["origin"] is not None:
        console.print("ablation: not run (--no-ablation, or a batch-invariant condition)")


def _rl_line(rl: dict) -> str:
    """Which two computations an rl bisect compared (bisect.json "rl")."""
    first = rl["first_logprob_step"]
    return (f"rl: sequence {rl['sequence']}: sampler decode (batch {rl['sampler_batch']}, row {rl['sampler_row']}) vs "
            f"trainer prefill (micro-batch {rl['micro_batch']}, {rl['padding']}); step s = the position giving "
            f"sampled token s; logprobs " + (f"first differ at token {first}" if first is not None else
                                             f"bit-identical over {rl['tokens']} tokens"))


def _table_steps(b: dict) -> list[int]:
    """Steps with a module table: the first difference, the lasting divergence, the flip."""
    lasting = (b.get("lasting") or {}).get("step")
    return list(dict.fromkeys(s for s in (b["first_numeric_step"], lasting, b["flip_step"]) if s is not None))


def _origin_line(b: dict):
    from rich.text import Text

    from nondet.cli.render import visible
    from nondet.fmt import fmt_hex_value

    origin, lasting = b["origin"], b.get("lasting")
    where = f"{b['condition_id']} row {b['position']} (run {b['run_id']}) vs reference (run {b['reference_run_id']})"
    if origin is None:
        return Text(f"{where}: no captured point differs over {b['steps']} steps", style="bold")
    line = Text(where)
    if "lasting" not in b:  # bisect.json written before lasting divergences were told apart
        line.append(f"\norigin: {_point(origin)}", style="bold")
    elif lasting is not None and _same(origin, lasting):
        line.append(f"\norigin: {_point(origin)}; lasting: {_via(lasting)}", style="bold")
    else:
        line.append(f"\nfirst difference: {_point(origin)}; {_transient(origin, lasting, b['transients'])}")
        line.append(_transients_part(b["transients"]))
        line.append(f"\nlasting origin: {_point(lasting)}; {_via(lasting)}" if lasting is not None else
                    f"\nno lasting divergence over {b['steps']} steps: no difference reached the KV cache "
                    "or flipped a token", style="bold")
    if b["flip_step"] is not None:
        t = b["flip_tokens"]
        line.append(f"\ntoken flip: step {b['flip_step']}: reference {visible(t['reference_piece'])} vs "
                    f"{visible(t['divergent_piece'])}, reference top1-top2 margin {fmt_hex_value(b['margin_at_flip'])}")
    else:
        line.append(f"\nno token flip over {b['steps']} steps")
    agreement = b.get("numeric_agreement")
    if agreement and not agreement["agree"]:
        line.append(f"\nprobe vs bisect: {agreement['note']}")
    return line


def _point(p: dict) -> str:
    """'step 3, model.layers.1.mlp.down_proj (op class matmul, layer 1), max |diff| 7.6e-06, 1 ULP'."""
    layer = "" if p["layer"] is None else f", layer {p['layer']}"
    return (f"step {p['step']}, {p['module']} (op class {p['op_class']}{layer}), "
            f"max |diff| {p['max_abs_diff']:.3g}, {p['max_ulp']} ULP")


def _same(a: dict, b: dict) -> bool:
    return (a["step"], a["module"], a["order"]) == (b["step"], b["module"], b["order"])


def _via(lasting: dict) -> str:
    if lasting["via"] == "kv cache":
        silent = lasting.get("silent_steps") or 0
        return (f"enters the KV cache at {lasting['enters_at']}"
                + (f" (its effect rounded away at {silent} later step(s))" if silent else ""))
    return "born at the flip step, it reached the logits directly"


REACH = {"layer": "absorbed before the residual stream", "residual stream": "reached the residual stream, "
         "absorbed before the KV cache and the logits", "logits": "reached the logits, not the KV cache"}


def _transient(origin: dict, lasting: dict | None, transients: list[dict]) -> str:
    """Why the first difference is not the lasting one."""
    if transients and transients[0]["step"] == origin["step"]:
        return "transient: " + REACH.get(transients[0]["reach"], transients[0]["reach"])
    return "absorbed within its step, before the lasting divergence born later in the same step"


def _transients_part(transients: list[dict], shown: int = 4) -> str:
    """'' or '\nother transient differences: step 7 (model...down_proj, matmul), ... (9 in all)'."""
    rest = transients[1:]
    if not rest:
        return ""
    parts = [f"step {t['step']} ({t['module']}, {t['op_class']})" for t in rest[:shown]]
    more = f" ... ({len(transients)} transient steps in all)" if len(rest) > shown else ""
    return "\nother transient differences: " + ", ".join(parts) + more


def _modules_table(step: int, b: dict, modules: list[dict], narrow: bool = False):
    """narrow: the module whole, its op class, max abs and max ULP; the layer (in the module's path),
    max rel and first diff index are in bisect_modules.csv."""
    from rich.table import Table

    lasting = b.get("lasting") or {}
    tags = [n for s, n in ((b["first_numeric_step"], "first difference"), (lasting.get("step"), "lasting divergence"),
                           (b["flip_step"], "token flip")) if s == step]
    rows = [m for m in modules if m["step"] == step and m["differs"]]
    table = Table(title=f"step {step} ({', '.join(tags)}): first differing modules, execution order")
    columns = NARROW_MODULE_COLUMNS if narrow else MODULE_COLUMNS
    for col in columns:
        table.add_column(col, justify="left" if col in ("module", "op class") else "right",
                         overflow="fold" if col == "module" else "ellipsis")
    for m in rows[:TABLE_ROWS]:
        origin = lasting.get("step") == step and lasting.get("order") == m["order"]
        cells = {"layer": _dash(m["layer"]), "module": m["module"] + (" <- lasting origin" if origin else ""),
                 "op class": m["op_class"], "max abs": f"{m['max_abs_diff']:.3g}",
                 "max rel": f"{m['max_rel_diff']:.3g}", "max ULP": str(m["max_ulp"]),
                 "first diff index": _dash(m["first_diff_index"])}
        table.add_row(*(cells[col] for col in columns), style="bold" if origin else None)
    differ = f"{len(rows)} of {sum(1 for m in modules if m['step'] == step)} points differ"
    table.caption = f"{differ}; every column: bisect_modules.csv" if narrow else f"{differ} (bisect_modules.csv)"
    return table


MODULE_COLUMNS = ("layer", "module", "op class", "max abs", "max rel", "max ULP", "first diff index")
NARROW_MODULE_COLUMNS = ("module", "op class", "max abs", "max ULP")


def _amplification_line(amplification: list[dict], steps: list[int]) -> str:
    """'residual stream max |diff| by layer: step 0: 0 2e-06 ... | step 93: ...'."""
    parts = []
    for step in steps:
        diffs = [f"{a['max_abs_diff']:.2g}" for a in sorted(amplification, key=lambda a: a["layer"])
                 if a["step"] == step]
        parts.append(f"step {step}: " + " ".join(diffs))
    return "residual stream max |diff| by layer (amplification): " + " | ".join(parts)


def _ablation_table(entries: list[dict], narrow: bool = False):
    """narrow: short headers and a legend; the first differing point and the lasting origin in one column."""
    from rich.table import Table

    yes = {True: "yes", False: "no"}
    table = Table(title="ablation: reference and divergent condition rerun with these op classes batch-invariant")
    columns = ("op classes", "tokens", "bits", "flip", "first differing point") if narrow else \
        ("op classes", "tokens match", "bit-identical", "flip step", "first differing point", "lasting origin")
    for col in columns:
        table.add_column(col, justify="right" if col in ("tokens match", "flip step", "tokens", "flip") else "left",
                         overflow="fold")
    if narrow:  # one op class a line ("attention +"), leaving the width to the module paths
        table.columns[0].max_width = max((len(op) for e in entries for op in e["ops"]), default=8) + 2
        table.min_width = max(map(len, ABLATION_LEGEND.splitlines()))
    for e in entries:
        places = (_first_and_lasting(e["first_diff"], e.get("lasting")),) if narrow else \
            (_where(e["first_diff"]), _where(e.get("lasting")))
        table.add_row(" + ".join(e["ops"]), yes[e["tokens_match"]], yes[e["activations_match"]],
                      _dash(e["first_token_divergence"]), *places)
    if narrow:
        table.caption = ABLATION_LEGEND
    return table


# under the narrow ablation table (each line under 80 columns)
ABLATION_LEGEND = ("tokens: tokens match the reference; bits: every activation bit-identical\n"
                   "flip: token flip step; lasting: where the lasting divergence is born")


def _first_and_lasting(first: dict | None, lasting: dict | None) -> str:
    """The first differing point, then 'lasting: same', 'lasting: -' or the lasting origin."""
    if first is None:
        return "-"
    same = lasting is not None and (lasting["step"], lasting["module"]) == (first["step"], first["module"])
    return f"{_where(first)}\nlasting: {'same' if same else _where(lasting)}"


def _where(point: dict | None) -> str:
    return "-" if point is None else f"step {point['step']}: {point['module']} ({point['op_class']})"


def _dash(value) -> str:
    return "-" if value is None else str(value)
