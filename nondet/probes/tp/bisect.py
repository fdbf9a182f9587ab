"""bisect of a tensor-parallel probe: one batched condition against the prompt alone AT ITS OWN DEGREE.

A lockstep compares two replays of one model; TP1 and TP2 are two different reductions, so the
reference here is the prompt alone at batch size 1 at the divergent condition's degree (its
stream carries tp_reference), not the run's TP1 reference. The replays run in a worker group of
that degree (bisect_rank.py: rank 0 captures and decides, the others follow); this process
chooses the target, builds both batches exactly as the probe did, and writes bisect.json,
bisect_modules.csv and ablation.json through bisect's own writer, with "tp_degree" added.

What rank 0 captures: its own shard of every column-parallel output (q/k/v, gate/up), the
summed output of every row-parallel linear (o_proj, down_proj: after the all-reduce), the rest
replicated, and around each row-parallel linear's all-reduce its partial (op class matmul) and
its sum ("<linear>.all_reduce", op class collective; probes/tp/collective.py TPTap), so a first
difference in the sum with equal partials names the collective. The ablation adds "collective"
(the mode's rank-order all-reduce alone) to the op classes: its causal test.
"""

import time

from nondet.errors import NothingToBisect, UsageError
from nondet.probes.bisect.bisect import (BisectConfig, BisectResult, describe, module_rows, replay_cache,
                                        replay_horizon, write_result)
from nondet.probes.bisect.choose import Target
from nondet.probes.bisect.reproduced import replay_record, reproduced
from nondet.probes.core.conditions import condition_from_record
from nondet.probes.core.diff import first_numeric_divergence, first_token_divergence
from nondet.probes.core.replay import DecodeSettings
from nondet.probes.models.loading import ModelSpec
from nondet.rundir import RunDir
from nondet.rundir.reader import has_header, read_condition_dicts, read_header_dict, read_stream_dicts


def is_tensor_parallel(run_dir: str) -> bool:
    """Was this run directory probed with --tp (its config says so)?"""
    rd = RunDir(run_dir)
    return has_header(rd) and bool(read_header_dict(rd).get("config", {}).get("tp"))


def run_tp_bisect(config: BisectConfig, on_stage=None) -> BisectResult:
    started = time.perf_counter()
    stage = on_stage or (lambda text: None)
    rd = RunDir(config.run_dir)
    rd.require()
    probe, streams = read_header_dict(rd)["config"], read_stream_dicts(rd)
    target, degree = choose_tp_target(read_condition_dicts(rd), streams, str(rd.path), config.condition,
                                      config.position)
    spec = ModelSpec(**probe["model"])
    settings = DecodeSettings(replay_horizon(config, probe, target), probe["temperature"], probe["seed"],
                              **replay_cache(probe))
    stage(f"loading model at --tp {degree}")
    main, ablation, tokenizer = _replay_in_group(config, probe, streams, spec, target, degree, settings, stage)
    result = describe(target, main, tokenizer, ablation, config.baseline)
    result.update(reproduced(main.reference, streams, target.reference_run_id))  # the degree's prompt alone
    result["replay"] = replay_record(settings, probe)
    result["tp_degree"] = degree
    result["seconds"] = round(time.perf_counter() - started, 2)
    rows = module_rows(main)
    write_result(rd, result, rows)
    return BisectResult(rd.path, result, rows, time.perf_counter() - started)


def choose_tp_target(conditions: list[dict], streams: list[dict], where: str, wanted: str | None = None,
                     position: int | None = None) -> tuple[Target, int]:
    """The run that leaves its own degree's reference first (tokens, then bits; default kernels,
    then the higher degree, the smaller batch, the lower run id), and its degree."""
    by_id = {c["condition_id"]: c for c in conditions}
    refs = {(s["kernels"], s.get("tp"), s.get("prompt_id", 0)): s for s in streams if s.get("tp_reference")}
    found = []
    for s in streams:
        ref = refs.get((s["kernels"], s.get("tp"), s.get("prompt_id", 0)))
        if s.get("tp_reference") or ref is None or not _picked(s, wanted, position):
            continue
        flip, numeric = first_token_divergence(ref, s), first_numeric_divergence(ref, s)
        if flip is not None or numeric is not None:
            found.append((s, ref, flip, numeric))
    if not found and (wanted or position is not None):  # the runs asked for: a flag that picks nothing
        raise UsageError(f"{where}: no run diverged from the prompt alone at its own TP degree with --condition / "
                         "--position as given")
    if not found:
        raise NothingToBisect(f"{where}: no run diverged from the prompt alone at its own TP degree")
    s, ref, flip, numeric = min(found, key=lambda f: (f[0]["kernels"] != "default", f[2] is None, f[2] or 0,
                                                       f[3] or 0, -f[0]["tp"],
                                                       by_id[f[0]["condition_id"]]["batch_size"], f[0]["run_id"]))
    condition = condition_from_record(by_id[s["condition_id"]])
    return Target(condition, s["position"], s["run_id"], ref["run_id"], flip, numeric, s.get("prompt_id", 0)), s["tp"]


def _picked(stream: dict, wanted: str | None, position: int | None) -> bool:
    cid = stream["condition_id"]
    return ((wanted is None or wanted in (cid, cid.split("/", 1)[-1]))
            and (position is None or stream["position"] == position))


def _replay_in_group(config: BisectConfig, probe: dict, streams: list[dict], spec: ModelSpec, target: Target,
                     degree: int, settings: DecodeSettings, stage):
    """(main Lockstep, Ablation or None, tokenizer): the replays on a worker group of the degree."""
    from nondet.kernels.mode import EXTRA_CLASSES, OP_CLASSES
    from nondet.probes.tp.group import WorkerGroup, free_port
    from nondet.probes.tp.job import BisectTask, Job
    from nondet.probes.tp.load import load_tokenizer, model_source

    tokenizer = load_tokenizer(model_source(spec.name), spec)
    from nondet.probes.static.bisect import probed_batches

    reference, divergent = probed_batches(tokenizer, probe, target, streams)
    classes = tuple(c for c in OP_CLASSES + EXTRA_CLASSES
                    if c not in config.baseline and c not in ("experts", "router"))  # TP models here are dense
    task = BisectTask(reference, divergent, target.position, target.condition.kernels, tuple(config.baseline),
                      config.ablation, classes)
    threads = probe.get("threads") or (None if spec.device.startswith("cuda") else 1)
    group = WorkerGroup(Job(spec, degree, (), (), settings, threads, free_port(), bisect=task))
    try:
        group.next("ready")
        stage(f"lockstep replay of {target.condition.condition_id} row {target.position} on {degree} ranks"
              + (" and its ablation" if config.ablation else ""))
        result = group.next("bisect")[1]
        group.finish()
    finally:
        group.close()
    return result["main"], result["ablation"], tokenizer
