"""bisect tells a transient difference (absorbed) from the lasting divergence.

The tiny Qwen3 runs under nondet's batch-invariant kernels (so the host BLAS cannot
interfere), except for layer 0's mlp.down_proj, replaced by a projection that is
batch-variant on purpose at chosen decode steps: when several rows decode together it moves
one output element of every row by 1 ULP. At a TRANSIENT step it picks an element that the
residual add rounds away (the layer's output stays bit-identical, nothing reaches the KV
cache); at a LASTING step one that the add keeps (layer 1's keys and values differ, and
the cache holds the difference from then on). The module logs what it did for each row:
the oracle. Bisect must call the first one transient and name the second as the lasting
origin; when only the lasting step is variant, the two coincide (the negative control).
"""

import dataclasses

import pytest

from nondet.probes.core.batch import build_batch
from nondet.probes.core.conditions import Condition
from nondet.probes.core.replay import DecodeSettings

VARIANT = "model.layers.0.mlp.down_proj"
STEPS = 10
TRANSIENT, LASTING = 2, 5  # decode steps (step 0 is the prefill)


def _variant_projection(original, residual_of):
    import torch

    class StepVariantLinear(torch.nn.Linear):
        """down_proj whose batched decode output moves by 1 ULP at `plan` steps.

        plan: {step: "absorbed" | "kept"}. `residual_of()` is the residual the layer adds
        to this output (the input of post_attention_layernorm, saved by a pre-hook). `log`
        holds (step, per-row element moved or None when no element qualified).
        """

        def __init__(self):
            super().__init__(original.in_features, original.out_features, bias=False)
            self.weight = original.weight
            self.plan: dict[int, str] = {}
            self.log: list[tuple[int, list]] = []
            self.decode_calls = 0

        def forward(self, x):  # x: [batch, seq, intermediate] bf16
            out = super().forward(x)
            if x.shape[0] == 1 or x.shape[1] != 1:
                return out
            self.decode_calls += 1
            step = self.decode_calls  # batched decode call n is step n
            if step not in self.plan:
                return out
            out = out.clone()
            moved = [_move_one(out[r, -1], residual_of()[r, -1], self.plan[step] == "absorbed")
                     for r in range(out.shape[0])]
            self.log.append((step, moved))
            return out

    return StepVariantLinear()


def _move_one(out_row, residual_row, absorbed: bool):
    """Move one element of out_row [hidden] by 1 ULP, chosen so that residual + out keeps
    (absorbed=True) or changes (False) its bits; return its index (None when none qualifies)."""
    import torch

    bumped = (out_row.view(torch.int16) + 1).view(torch.bfloat16)
    same = ((residual_row + out_row).view(torch.int16) == (residual_row + bumped).view(torch.int16))
    candidates = (same if absorbed else ~same).nonzero().flatten()
    if candidates.numel() == 0:
        return None
    i = int(candidates[0])
    out_row[i] = bumped[i]
    return i


@pytest.fixture(scope="module")
def toy(tiny_model_dir):
    from nondet.probes.models.loading import ModelSpec, load_model

    loaded = load_model(ModelSpec(str(tiny_model_dir)))
    layer = loaded.model.get_submodule("model.layers.0")
    saved = {}
    layer.post_attention_layernorm.register_forward_pre_hook(lambda m, args: saved.update(residual=args[0]))
    layer.mlp.down_proj = _variant_projection(layer.mlp.down_proj, lambda: saved["residual"])
    from nondet.kernels.mode import verify_coverage

    # the mode's op census runs the model once, decode step included, when first entered: taken here, so
    # it does not count as one of the variant projection's batched decode calls
    verify_coverage(loaded.model)
    return loaded


def _lockstep(loaded, plan: dict[int, str], row: int = 1):
    from nondet.kernels import batch_invariant
    from nondet.probes.bisect.lockstep import run_lockstep

    variant = loaded.model.get_submodule(VARIANT)
    variant.plan, variant.decode_calls = plan, 0
    variant.log.clear()
    tok = loaded.tokenizer
    target = tok("Tell me about Richard Feynman", add_special_tokens=False)["input_ids"]
    fillers = [tok("The quick brown fox jumps over the lazy dog", add_special_tokens=False)["input_ids"]]
    ref = build_batch(Condition("t/bs1/ref", "default", 1, (0,), "none"), target, fillers, tok.pad_token_id)
    condition = Condition("t/bs2/ends", "default", 2, (0, 1), "same-length")
    div = dataclasses.replace(build_batch(condition, target, fillers, tok.pad_token_id), target_rows=(row,))
    ls = run_lockstep(loaded.model, tok, ref, div, DecodeSettings(STEPS, 0.0, 0),
                      lambda: batch_invariant(model=loaded.model))
    return ls, {step: moved[row] for step, moved in variant.log}


def _where(point: dict | None) -> tuple | None:
    return None if point is None else (point["step"], point["module"], point["op_class"], point["layer"])


def test_transient_first_difference_is_not_the_lasting_origin(toy):
    ls, moved = _lockstep(toy, {TRANSIENT: "absorbed", LASTING: "kept"})
    assert moved[TRANSIENT] is not None and moved[LASTING] is not None  # the oracle did both
    assert _where(ls.first_diff) == (TRANSIENT, VARIANT, "matmul", 0)
    assert ls.first_diff["max_ulp"] == 1 and ls.first_diff["first_diff_index"] == moved[TRANSIENT]
    assert [_where(t) for t in ls.transients] == [(TRANSIENT, VARIANT, "matmul", 0)]
    assert ls.transients[0]["reach"] == "layer"  # the residual add rounded it away
    assert _where(ls.lasting) == (LASTING, VARIANT, "matmul", 0)
    assert ls.lasting["via"] == "kv cache" and ls.lasting["enters_at"].startswith("model.layers.1.self_attn.")
    assert ls.lasting["first_diff_index"] == moved[LASTING]
    assert sorted(ls.rows) == [TRANSIENT, LASTING]  # both tables kept
    assert not any(r["differs"] for s in range(TRANSIENT + 1, LASTING) for r in ls.rows.get(s, []))


def test_lasting_only_coincides_with_the_first_difference(toy):
    ls, moved = _lockstep(toy, {LASTING: "kept"})
    assert moved[LASTING] is not None
    assert _where(ls.first_diff) == _where(ls.lasting) == (LASTING, VARIANT, "matmul", 0)
    assert ls.transients == []


def test_only_transient_differences_leave_no_lasting_divergence(toy):
    ls, moved = _lockstep(toy, {TRANSIENT: "absorbed", LASTING: "absorbed"})
    assert moved[TRANSIENT] is not None and moved[LASTING] is not None
    assert ls.lasting is None and ls.flip_step is None
    assert [t["step"] for t in ls.transients] == [TRANSIENT, LASTING]
    assert ls.first_logprob_step is None  # nothing reached the sampled token's logprob


# -- bisect.json, the CLI output and the report on that lockstep ------------------------------


@pytest.fixture(scope="module")
def described(toy):
    """bisect.json of the transient-then-lasting lockstep; the probe saw the replay's logprob step."""
    from nondet.probes.bisect.bisect import describe, module_rows
    from nondet.probes.bisect.choose import Target

    ls, _ = _lockstep(toy, {TRANSIENT: "absorbed", LASTING: "kept"})
    condition = Condition("default/bs2/ends", "default", 2, (0, 1), "same-length")
    target = Target(condition, 1, 2, 0, None, ls.first_logprob_step)
    return describe(target, ls, toy.tokenizer, None), module_rows(ls)


def test_bisect_json_keeps_origin_and_adds_lasting(described):
    b, rows = described
    assert _where(b["origin"]) == (TRANSIENT, VARIANT, "matmul", 0)  # unchanged meaning: the first difference
    assert b["first_numeric_step"] == TRANSIENT
    assert _where(b["lasting"]) == (LASTING, VARIANT, "matmul", 0)
    assert [t["step"] for t in b["transients"]] == [TRANSIENT]
    assert b["probe_numeric_step"] == b["first_logprob_step"] == LASTING
    assert b["numeric_agreement"]["agree"] is False
    assert b["numeric_agreement"]["note"] == (
        f"bisect's first differing activation is at step {TRANSIENT}, the probe's first numeric divergence at "
        f"step {LASTING} (the sampled token's logprob bits): the differences at step(s) {TRANSIENT} were absorbed "
        f"before the logits; the lasting divergence, born at step {LASTING}, is the one the probe sees")
    assert {r["step"] for r in rows} == {TRANSIENT, LASTING}


def test_cli_names_both_and_tables_the_lasting_step(described):
    from rich.console import Console

    from nondet.cli.render_bisect import print_bisect

    b, rows = described
    console = Console(record=True, width=1000)
    print_bisect(b, rows, console)
    out = console.export_text()
    assert (f"first difference: step {TRANSIENT}, {VARIANT} (op class matmul, layer 0), max |diff| 7.63e-06, "
            "1 ULP; transient: absorbed before the residual stream") in out
    assert f"lasting origin: step {LASTING}, {VARIANT} (op class matmul, layer 0)" in out
    assert f"; enters the KV cache at {b['lasting']['enters_at']}" in out
    assert f"probe vs bisect: {b['numeric_agreement']['note']}" in out
    assert f"step {TRANSIENT} (first difference): first differing modules" in out
    assert f"step {LASTING} (lasting divergence): first differing modules" in out
    assert f"{VARIANT} <- lasting origin" in out


def test_report_names_both_and_tables_the_lasting_step(described, tmp_path):
    from report_fixtures import write_run

    from nondet.probes.bisect.bisect import MODULE_FIELDS
    from nondet.reports.bisect_sections import bisect_blocks
    from nondet.reports.tables import read_tables
    from nondet.reports.blocks import Report, Section
    from nondet.reports.markdown import render_markdown
    from nondet.rundir import RunDir

    b, rows = described
    rd = RunDir(write_run(tmp_path / "run", bisect=True))
    rd.write_json("bisect.json", b)
    rd.write_csv("bisect_modules.csv", rows, MODULE_FIELDS)
    md = render_markdown(Report("r", [Section("bisect", "b", bisect_blocks(read_tables(rd.path), []))]))
    assert (f"The first bit difference is born at **step {TRANSIENT}** in `{VARIANT}` (op class matmul, layer 0). "
            "It is transient: absorbed before the residual stream, so nothing of it reached later steps. "
            f"The lasting divergence is born at **step {LASTING}** in `{VARIANT}` (op class matmul, layer 0); it "
            f"enters the KV cache at `{b['lasting']['enters_at']}`, which every later step reads") in md
    assert f"First differing modules at step {TRANSIENT}, in execution order" in md
    assert f"Differing modules at step {LASTING}, where the lasting divergence is born" in md
    assert b["numeric_agreement"]["note"] in md
