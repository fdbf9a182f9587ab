"""`nondet bisect` on a `nondet rl` run: where the trainer's bits leave the sampler's, and which kernel.

Reads the rl run directory (config.json: model, processing; summary.json: the sampler/trainer
pairs; streams.jsonl: both sides' tokens), picks one trainer condition and one sequence,
replays the sampler's decode and the trainer's teacher-forced micro-batch in lockstep
(bisect_replay.py) and names the first (position, module, op class) whose bits differ. The
ablation reruns both sides with one op class at a time batch-invariant: the classes whose
invariant kernels make every activation, hence every logprob, equal (KL exactly 0).
Writes bisect.json (with an "rl" key), bisect_modules.csv and ablation.json, like a probe's.

Targets: --condition is a trainer condition ("default/trainer/mb4/right" or "trainer/mb4/right");
default: the default-kernels pair whose sequences differ earliest. --position is the
sequence's prompt id; default: the sequence whose logprobs differ first.
"""

import time

from nondet.errors import RunDirError, UsageError
from nondet.probes.bisect.ablation import run_ablation
from nondet.probes.bisect.bisect import (BisectConfig, BisectResult, describe, kernel_scope, module_rows,
                                        write_result)
from nondet.probes.bisect.choose import Target
from nondet.probes.core.conditions import Condition
from nondet.probes.core.numerics import numerics_scope
from nondet.probes.models.loading import ModelSpec, load_model
from nondet.probes.rl.bisect_replay import SamplerBatchPlan, TrainerBatchPlan, run_rl_lockstep
from nondet.probes.rl.processed import Processing
from nondet.probes.rl.trainer import Sequence
from nondet.rundir import RunDir
from nondet.rundir.reader import read_header_dict, read_stream_dicts, read_summary_dict, stored_command


def is_rl_run(run_dir) -> bool:
    """A run directory written by `nondet rl` (the CLI's bisect routes it here)."""
    rd = RunDir(run_dir)
    rd.require()
    return stored_command(rd) == "rl"


def run_rl_bisect(config: BisectConfig, on_stage=None) -> BisectResult:
    """BisectConfig -> BisectResult for an rl run directory."""

    started = time.perf_counter()
    stage = on_stage or (lambda text: None)
    if config.max_steps:
        # the trainer's side is one teacher-forced forward over whole sequences: cutting them
        # would change the micro-batch's shapes, i.e. the very computation being bisected
        raise UsageError("--max-steps does not apply to an rl run: the trainer's forward covers the whole "
                         "sequence; bisect replays it in full")
    rd = RunDir(config.run_dir)
    rl = read_header_dict(rd)["config"]
    streams, summary = read_stream_dicts(rd), read_summary_dict(rd)
    pair = choose_pair(summary, config.condition, str(rd.path))
    sampler, trainer, target = plans(pair, streams, config.position)
    stage("loading model")
    loaded = load_model(ModelSpec(**rl["model"]))
    processing = Processing(rl["temperature"], rl["top_k"], rl["top_p"])
    mode, baseline, kept = pair["kernels"], config.baseline, {}

    def replay(ops):
        scope = kernel_scope(mode, baseline + tuple(ops or ()), loaded.model)
        kept[frozenset(ops or ())] = ls = run_rl_lockstep(loaded.model, loaded.tokenizer, sampler, trainer,
                                                          processing, scope)
        return ls

    with numerics_scope(rl.get("threads")):
        stage(f"lockstep: sampler decode vs {pair['trainer_condition']}, sequence {target.prompt_id}")
        main = replay(None)
        ablation = _ablate(config, mode, main, replay, stage, loaded.model)
    result = describe(target, main, loaded.tokenizer, ablation, baseline)
    for entry in result["ablation"]:  # equal activations imply equal logprobs; say so per entry
        entry["logprobs_match"] = kept[frozenset(entry["ops"])].first_logprob_step is None
    result["reference_reproduced"] = _reproduced(main.reference, streams, target.reference_run_id)
    result["rl"] = rl_part(pair, sampler, trainer, target, main)
    result["seconds"] = round(time.perf_counter() - started, 2)
    rows = module_rows(main)
    write_result(rd, result, rows)
    return BisectResult(rd.path, result, rows, time.perf_counter() - started)


def choose_pair(summary: dict, wanted: str | None, where: str) -> dict:
    """The trainer condition's pair: --condition, else the default-kernels pair that differs earliest."""
    pairs = [p for p in (summary.get("rl") or {}).get("pairs", []) if p.get("n_tokens")]
    if any(p["sampler"] == "external" for p in pairs):
        raise UsageError(f"{where} compares exported rollouts: their sampler ran outside nondet, so there is no "
                         "sampler side to replay; bisect needs `nondet rl` to sample in-process")
    if wanted is not None:
        pairs = [p for p in pairs if wanted in (p["trainer_condition"], p["trainer_condition"].split("/", 1)[1])]
        if not pairs:
            raise UsageError(f"{where} has no trainer condition {wanted!r}; see summary.json rl.pairs")
    if not pairs:
        raise RunDirError(f"{where}: summary.json has no sampler/trainer pair with tokens; rerun `nondet rl`")
    return min(pairs, key=lambda p: (p["kernels"] != "default", p["seqs_differ"] == 0, _earliest(p),
                                     p["micro_batch"]))


def _earliest(pair: dict) -> int:
    return min((f for f in pair["first_diff"] if f is not None), default=1 << 30)


def plans(pair: dict, streams: list[dict], position: int | None) -> tuple[SamplerBatchPlan, TrainerBatchPlan, Target]:
    """The sampler batch and the trainer micro-batch that computed one sequence, as the rl run built them."""
    prompt_id = _sequence(pair, position)
    sampled = sorted((s for s in streams if s.get("side") == "sampler" and s["kernels"] == pair["sampler"]),
                     key=lambda s: s["prompt_id"])
    own = next(s for s in sampled if s["prompt_id"] == prompt_id)
    if own.get("load") == "continuous":
        raise UsageError("the sampler ran in the continuous-batching engine, whose batches bisect cannot rebuild "
                         "step for step; bisect a `nondet rl` run without --load continuous")
    batch = sorted((s for s in sampled if s["condition_id"] == own["condition_id"]), key=lambda s: s["position"])
    sampler = SamplerBatchPlan([s["prompt_ids"] for s in batch], [[st["token"] for st in s["steps"]] for s in batch],
                               own["position"])
    seqs = [Sequence(s["prompt_id"], tuple(s["prompt_ids"]), tuple(st["token"] for st in s["steps"]))
            for s in sampled if s["steps"]]
    i, mb = next(k for k, s in enumerate(seqs) if s.prompt_id == prompt_id), pair["micro_batch"]
    trainer = TrainerBatchPlan(seqs[i - i % mb: i - i % mb + mb], i % mb, pair["padding"])
    run = next(s for s in streams if s["condition_id"] == pair["trainer_condition"] and s["prompt_id"] == prompt_id)
    condition = Condition(pair["trainer_condition"], pair["kernels"], mb, (i % mb,), "none", load="rl-trainer",
                          prompt_id=prompt_id)
    first = pair["first_diff"][pair["prompt_ids"].index(prompt_id)]
    return sampler, trainer, Target(condition, i % mb, run["run_id"], own["run_id"], None, first, prompt_id)


def _sequence(pair: dict, position: int | None) -> int:
    """--position (a prompt id of the pair), else the sequence whose logprobs differ first."""
    ids = pair["prompt_ids"]
    if position is not None:
        if position not in ids:
            raise UsageError(f"--position {position}: an rl run's sequences are prompt ids {ids[0]}..{ids[-1]}")
        return position
    differing = [(f, pid) for f, pid in zip(pair["first_diff"], ids) if f is not None]
    return min(differing)[1] if differing else ids[0]


def _ablate(config, mode: str, main, replay, stage, model):
    if not config.ablation or mode != "default" or main.first_diff is None:
        return None
    from nondet.probes.bisect.classify import ablatable

    classes = tuple(c for c in ablatable(model) if c not in config.baseline)
    return run_ablation(replay, classes, main.first_diff,
                        lambda ops: stage(f"ablation: batch-invariant {' + '.join(ops)}"))


def _reproduced(reference: list[dict], streams: list[dict], run_id: int) -> bool:
    """Does the sampler replay give the recorded sampler stream's logprob bits (same numerics)?"""
    recorded = next(s for s in streams if s["run_id"] == run_id)["steps"]
    return [(s["token"], s["logprob"]) for s in recorded] == [(s["token"], s["logprob"]) for s in reference]


def rl_part(pair: dict, sampler: SamplerBatchPlan, trainer: TrainerBatchPlan, target: Target, ls) -> dict:
    """bisect.json "rl": which two computations were compared, and where their logprobs first differ."""
    return {"sequence": target.prompt_id, "trainer_condition": pair["trainer_condition"],
            "sampler_batch": len(sampler.prompts), "sampler_row": sampler.row, "micro_batch": pair["micro_batch"],
            "padding": trainer.padding, "tokens": len(ls.reference), "first_logprob_step": ls.first_logprob_step}
