"""A synthetic run directory, written the way the probe and bisect write theirs.

Three completions over 8 runs of 5 conditions (kernels "default"):
  A (reference, 4 runs)  "... born in Queens, New York. He studied ..."
  B (2 runs)             flips at step 5: " New" instead of " Queens"
  C (1 run)              follows A, flips at step 8 to the piece `<script>alert(1)</script>`,
                         then emits pieces with a surrogate-escaped byte 0xff, U+FFFD and NUL
First token divergence: step 5; first numeric divergence: step 1.
`confirm=True` adds a "batch-invariant" mode whose 8 runs are all bit-identical to A.
`bisect=True` adds bisect.json, bisect_modules.csv and ablation.json.
"""

from pathlib import Path

from nondet.rundir import RunDir

SCRIPT = "<script>alert(1)</script>"
BAD_BYTE = "\udcff"  # byte 0xff decoded with errors="surrogateescape"
PIECES = {
    1: "Richard", 2: " Feynman", 3: " was", 4: " born", 5: " in", 6: " Queens", 7: ",",
    8: " New", 9: " York", 10: ".", 11: " He", 12: " studied", 13: " at", 14: " MIT",
    15: " City", 16: SCRIPT, 17: BAD_BYTE, 18: "\ufffd", 19: "\x00", 20: "\n",
}
A = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
B = A[:5] + [8, 9, 15, 10, 11, 12, 13, 14, 20]
C = A[:8] + [16, 17, 18, 19, 10, 11]
REF_MARGIN = {5: "0x1.0p-7", 8: "0x1.0p-5"}  # near-ties where the flips happen
RUNNER_UP = {5: 8, 8: 16}  # the reference's second choice there: the token the flipped runs took
# (condition suffix, batch size, positions, completion per position, first numeric step)
CONDITIONS = [
    ("bs1", 1, [0], [A], None),
    ("bs2/ends", 2, [0, 1], [A, A], 2),
    ("bs4/ends", 4, [0, 3], [A, B], 1),
    ("bs8/ends", 8, [0, 7], [B, C], 1),
    ("bs8/ragged", 8, [0], [A], 3),
]


def write_run(path: Path, *, confirm: bool = False, bisect: bool = False) -> Path:
    """Write the synthetic run directory at `path` and return it."""
    rd = RunDir(path)
    argv = ["nondet", "probe", "--batch-sizes", "1,2,4,8", "--runs", "7", "--max-new-tokens", "14"]
    modes = ["default"] + (["batch-invariant"] if confirm else [])
    rd.write_json("config.json", {"command": "probe", "argv": argv + (["--confirm"] if confirm else []),
                                  "config": {"batch_sizes": [1, 2, 4, 8], "runs": 7}, "nondet_version": "0.1.0"})
    rd.write_json("fingerprint.json", _fingerprint())
    summary = {"modes": {}, "verdict": "Batch-variant: 3 distinct completions over 8 runs; first token divergence at 5"}
    run_id = 0
    for mode in modes:
        runs = []
        for suffix, bs, positions, comps, num_step in CONDITIONS:
            cid = f"{mode}/{suffix}"
            rd.append_jsonl("conditions.jsonl", {
                "condition_id": cid, "kernels": mode, "load": "static", "batch_size": bs,
                "positions": positions, "fillers": _fillers(suffix, bs),
                "label": f"bs={bs} pos={','.join(map(str, positions))}"})
            for pos, tokens in zip(positions, comps):
                if mode != "default":
                    tokens, num_step = A, None
                runs.append(_write_stream(rd, run_id, cid, mode, pos, tokens, num_step, is_ref=(suffix == "bs1")))
                run_id += 1
        summary["modes"][mode] = _summary(mode, runs)
    rd.write_json("summary.json", summary)
    if bisect:
        _write_bisect(rd)
    return path


def _fillers(suffix: str, bs: int) -> str:
    return "none" if bs == 1 else ("ragged" if "ragged" in suffix else "same-length")


def _fingerprint() -> dict:
    return {"python": "3.11.2", "platform": "Linux-x86_64", "torch": "2.13.0", "transformers": "5.17.0",
            "device": "cpu", "dtype": "bfloat16", "threads": 2, "tf32": False, "deterministic_algorithms": False,
            "attn_implementation": "sdpa",
            "model": {"name": "nondet-embedded-qwen3", "embedded_default": True, "layers": 4,
                      "hidden": 512, "vocab": 4096, "params": 12345678}}


def _write_stream(rd, run_id, cid, mode, pos, tokens, num_step, is_ref) -> dict:
    steps = []
    for i, tok in enumerate(tokens):
        lp = -0.25 - i / 64 - (2.0 ** -20 if num_step is not None and i >= num_step else 0.0)
        alt = RUNNER_UP.get(i, tokens[i] + 1 if tokens[i] + 1 in PIECES else 1)
        alt = alt if alt != tok else 6
        steps.append({"token": tok, "piece": PIECES[tok], "logprob": lp.hex(),
                      "top": [[tok, lp.hex()], [alt, (lp - 0.01).hex()]] + [[k, (-9.0 - k).hex()] for k in range(3)],
                      "margin": REF_MARGIN.get(i, "0x1.0p-1")})
    text = "".join(PIECES[t] for t in tokens)
    rd.append_jsonl("streams.jsonl", {"run_id": run_id, "condition_id": cid, "kernels": mode, "position": pos,
                                       "is_reference": is_ref, "prompt_tokens": 6, "finish": "length",
                                       "text": text, "steps": steps})
    return {"run_id": run_id, "condition_id": cid, "position": pos, "tokens": tokens, "num_step": num_step,
            "text": text, "is_reference": is_ref}


def _first_diff(a: list, b: list) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _summary(mode: str, runs: list[dict]) -> dict:
    ref = next(r for r in runs if r["is_reference"])
    distinct = []
    for r in runs:
        if r["tokens"] not in distinct:
            distinct.append(r["tokens"])
    rows = [{"run_id": r["run_id"], "condition_id": r["condition_id"], "position": r["position"],
             "first_token_divergence": _first_diff(ref["tokens"], r["tokens"]),
             "first_numeric_divergence": r["num_step"], "completion_id": distinct.index(r["tokens"])} for r in runs]
    counts = [sum(r["tokens"] == d for r in runs) for d in distinct]
    conds = []
    for cid in dict.fromkeys(r["condition_id"] for r in runs):
        mine = [x for x in rows if x["condition_id"] == cid]
        conds.append({"condition_id": cid, "distinct_completions": len({x["completion_id"] for x in mine}),
                      "first_token_divergence": _min([x["first_token_divergence"] for x in mine]),
                      "first_numeric_divergence": _min([x["first_numeric_divergence"] for x in mine]),
                      "n_runs": len(mine)})
    return {"kernels": mode, "reference_run_id": ref["run_id"], "n_runs": len(runs), "n_conditions": len(conds),
            "distinct_completions": len(distinct), "most_common_count": max(counts),
            "first_token_divergence": _min([x["first_token_divergence"] for x in rows]),
            "first_numeric_divergence": _min([x["first_numeric_divergence"] for x in rows]),
            "runs": rows, "conditions": conds,
            "completions": [{"completion_id": i, "count": counts[i], "is_reference": d == ref["tokens"],
                             "text": "".join(PIECES[t] for t in d), "tokens": d} for i, d in enumerate(distinct)],
            "branch_tree": _tree([r["tokens"] for r in runs], ref["tokens"], 0)}


def _min(xs):
    xs = [x for x in xs if x is not None]
    return min(xs) if xs else None


def _tree(seqs: list[list[int]], ref: list[int], start: int) -> dict | None:
    step = start
    while all(len(s) > step for s in seqs) and len({s[step] for s in seqs}) == 1:
        step += 1
    if all(len(s) <= step for s in seqs) or len(seqs) < 2:
        return None
    alts = []
    for tok in dict.fromkeys(s[step] for s in seqs if len(s) > step):
        group = [s for s in seqs if len(s) > step and s[step] == tok]
        alts.append({"token": tok, "piece": PIECES[tok], "count": len(group),
                     "margin": REF_MARGIN.get(step, "0x1.0p-1"),
                     "is_reference": ref[: step + 1] == group[0][: step + 1],
                     "child": _tree(group, ref, step + 1)})
    prefix = "".join(PIECES[t] for t in seqs[0][:step])[-80:]
    return {"step": step, "count": len(seqs), "prefix_text": prefix, "alternatives": alts}


def _write_bisect(rd: RunDir) -> None:
    layers, classes = 4, ["norm", "matmul", "attention", "matmul", "norm", "matmul", "activation", "matmul"]
    names = ["input_layernorm", "self_attn.q_proj", "self_attn.attn", "self_attn.o_proj",
             "post_attention_layernorm", "mlp.gate_proj", "mlp.act_fn", "mlp.down_proj"]
    rows = []
    for step in (1, 5):
        order = 0
        rows.append(_mod_row(step, order, None, "model.embed_tokens", "embedding", 0.0))
        for layer in range(layers):
            for name, cls in zip(names, classes):
                order += 1
                diff = 0.0 if (layer == 0 and order < 2) else 2.0 ** (-12 + layer + order % 3 + step / 5)
                rows.append(_mod_row(step, order, layer, f"model.layers.{layer}.{name}", cls, diff))
        rows.append(_mod_row(step, order + 1, None, "lm_head", "matmul", 0.05 * step))
    fields = ["step", "order", "layer", "module", "op_class", "max_abs_diff", "max_rel_diff", "max_ulp",
              "first_diff_index", "differs"]
    rd.write_csv("bisect_modules.csv", rows, fields)
    rd.write_json("bisect.json", {
        "condition_id": "default/bs8/ends", "run_id": 5, "reference_run_id": 0,
        "origin": {"step": 1, "module": "model.layers.0.self_attn.q_proj", "op_class": "matmul", "layer": 0},
        "first_numeric_step": 1, "flip_step": 5, "margin_at_flip": "0x1.0p-7", "steps": 6, "probe_flip_step": 5,
        "flip_tokens": {"reference": 6, "reference_piece": " Queens", "divergent": 8, "divergent_piece": " New",
                        "divergent_margin": "0x1.0p-9"},
        "amplification": [{"step": s, "layer": la, "max_abs_diff": 2.0 ** (-10 + la + s / 2)}
                          for s in range(6) for la in range(layers)]})
    rd.write_json("ablation.json", {
        "ablation": [
            {"ops": ["matmul"], "tokens_match": True, "activations_match": True,
             "first_token_divergence": None, "first_numeric_step": None, "origin_removed": True},
            {"ops": ["norm"], "tokens_match": False, "activations_match": False,
             "first_token_divergence": 5, "first_numeric_step": 1, "origin_removed": False,
             "first_diff": {"step": 1, "module": "model.layers.0.self_attn.q_proj", "op_class": "matmul",
                            "layer": 0}},
            {"ops": ["attention"], "tokens_match": False, "activations_match": False,
             "first_token_divergence": 5, "first_numeric_step": 1, "origin_removed": False},
            {"ops": ["matmul", "norm", "attention", "softmax"], "tokens_match": True, "activations_match": True,
             "first_token_divergence": None, "first_numeric_step": None, "origin_removed": True}],
        "minimal_set": ["matmul"]})


def _mod_row(step, order, layer, module, op_class, diff) -> dict:
    return {"step": step, "order": order, "layer": layer, "module": module, "op_class": op_class,
            "max_abs_diff": diff, "max_rel_diff": diff * 4, "max_ulp": int(diff * 2**16),
            "first_diff_index": 17 if diff else None, "differs": diff > 0}
