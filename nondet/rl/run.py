"""`nondet rl` as a library call: sampler side, then trainer side, one run directory.

    load the model once -> sampler streams (sampled in-process, or --rollouts read) ->
    trainer streams per kernels mode x micro-batch (teacher-forced, backward) ->
    summary.json pairing them (nondet.rl.summary)

Both sides are sources on the probe's Source interface and run through the probe's one loop
(probes/probe.py: run_streams) into the one writer, so every stream is on disk the moment
it exists.
"""

import itertools
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from nondet.probes.core.chat import prompt_token_ids
from nondet.probes.core.corpus import DEMO_PROMPTS
from nondet.probes.models.context import check_prompts_fit
from nondet.probes.models.loading import load_model
from nondet.probes.core.numerics import numerics_scope
from nondet.probes.probe import OnCondition, default_run_dir, run_streams
from nondet.probes.rl.continuous import RLContinuousSamplerSource
from nondet.probes.rl.rollouts import RolloutsSource
from nondet.probes.rl.sampler import RLSamplerSource
from nondet.probes.rl.server import RLServerSamplerSource
from nondet.probes.rl.trainer import RLTrainerSource, Sequence, check_forward, repeated
from nondet.rl.config import RLConfig, validate
from nondet.rl.rollouts import check_vocabulary, read_rollouts
from nondet.rl.summary import rl_summary
from nondet.rundir import RunDir
from nondet.rundir.reader import read_conditions, read_streams
from nondet.rundir.records import Summary, to_json
from nondet.rundir.writer import RunWriter, new_header, refuse_a_used_run_dir


@dataclass
class RLResult:
    run_dir: Path
    summary: dict  # summary.json contents
    seconds: float


def run_rl(config: RLConfig, on_condition: OnCondition | None = None, loaded=None) -> RLResult:
    """Run both sides the config describes and write the run directory; loaded: a LoadedModel to reuse."""
    config = config if config.prompts or config.rollouts else replace(config, prompts=DEMO_PROMPTS)
    validate(config)
    if config.prompts:  # before the weights load: a sequence past the context is refused in a second
        check_prompts_fit(config.model, config.prompts, config.max_new_tokens)
    refuse_a_used_run_dir(config.out)
    rollouts = read_rollouts(config.rollouts) if config.rollouts else None
    started = time.perf_counter()
    with numerics_scope(config.threads):
        loaded = loaded or load_model(config.model)
        if rollouts:
            check_vocabulary(rollouts, loaded.model.get_input_embeddings().num_embeddings, config.rollouts)
        # before the sampler's minutes: a random train-mode forward or a model packing cannot hold is refused now
        check_forward(loaded.model, repeated(_prompt_tokens(config, rollouts, loaded.tokenizer)), config.padding,
                      config.kernels)
        run_ids = itertools.count()
        sampler = sampler_source(config, rollouts, loaded, run_ids)
        writer = RunWriter(RunDir(config.out or default_run_dir("rl")))
        writer.write_header(new_header("rl", asdict(config), config.argv), sampler.open().fingerprint)
        sampled = run_streams(sampler, writer, on_condition)
        trainer = RLTrainerSource(config, loaded, run_ids, sequences_by_mode(sampled, config.kernels),
                                  getattr(sampler, "distributions", None))  # in-process only: the exact KL
        trainer.open()
        run_streams(trainer, writer, on_condition)
        summary = write_summary(writer, config)
    return RLResult(writer.run_dir.path, summary, time.perf_counter() - started)


def _prompt_tokens(config: RLConfig, rollouts, tokenizer) -> list[int]:
    """The run's prompt token ids, one list (the rollouts' own where given)."""
    if rollouts:
        return [t for r in rollouts for t in r.prompt_ids]
    return [t for p in config.prompts for t in prompt_token_ids(tokenizer, p)]


def sampler_source(config: RLConfig, rollouts, loaded, run_ids):
    """Exported rollouts, a live server (--endpoint), the continuous-batching engine, or batched generate."""
    if rollouts:
        return RolloutsSource(rollouts, loaded, run_ids)
    if config.endpoint:
        return RLServerSamplerSource(config, loaded, run_ids)
    if config.load == "continuous":
        return RLContinuousSamplerSource(config, loaded, run_ids)
    return RLSamplerSource(config, loaded, run_ids)


def sequences_by_mode(sampled: list[dict], modes: tuple[str, ...]) -> dict[str, list[Sequence]]:
    """The sampler streams of each mode as teacher-forcing inputs (rollouts serve every mode)."""
    out = {}
    for mode in modes:
        of_mode = [s for s in sampled if s["kernels"] in (mode, "external") and s["steps"]]
        out[mode] = [Sequence(s["prompt_id"], tuple(s["prompt_ids"]), tuple(st["token"] for st in s["steps"]))
                     for s in sorted(of_mode, key=lambda s: s["prompt_id"])]
    return out


def write_summary(writer: RunWriter, config: RLConfig) -> dict:
    streams = [to_json(s) for s in read_streams(writer.run_dir)]
    conditions = [to_json(c) for c in read_conditions(writer.run_dir)]
    doc = rl_summary(streams, conditions, asdict(config))
    return writer.write_summary(Summary(modes=doc["modes"], verdict=doc["verdict"], extra={"rl": doc["rl"]}))
