"""pytest plugin (entry point `pytest11`): assert that a model in memory is batch-invariant.

    def test_my_model_is_batch_invariant(assert_batch_invariant):
        model, tokenizer = load_my_model()
        assert_batch_invariant(model, tokenizer, prompts=["Tell me about Richard Feynman"],
                               batch_sizes=(1, 8, 16), max_new_tokens=100,
                               kernels="batch-invariant")

`prompts_file="prompts.jsonl"` reads the prompts instead in the one prompt-file format of
`nondet probe --prompts` (JSONL, so a prompt may hold newlines, or plain text one a line). A
{"messages": [...]} line (or a nondet.prompt.Chat in `prompts`) is probed through the tokenizer's
chat template; speculative decoding takes plain-text prompts only and refuses it in one line.
Or, without the fixture, `from nondet.pytest_plugin import assert_batch_invariant`.
A violation raises AssertionError whose message names each failing condition's first
divergence and branch tokens. `assert_speculative_equivalent` (fixture of the same name)
asserts that speculative decoding gives plain greedy decoding's tokens and logprob bits. This module loads in every pytest run of an environment
where nondet is installed, so it imports no torch (nor anything heavy) at import time.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pytest

if TYPE_CHECKING:
    from nondet.prompt import Prompt

DEFAULT_PROMPTS = ("Tell me about Richard Feynman",)


def assert_batch_invariant(model, tokenizer, prompts: "Sequence[Prompt] | None" = None,
                           batch_sizes: Sequence[int] = (1, 8, 16), max_new_tokens: int = 64,
                           kernels: str = "default", require: str = "identical",
                           prompts_file: Path | str | None = None):
    """Probe (model, tokenizer) in memory under the policy; AssertionError on a violation.

    prompts: the prompts, text or nondet.prompt.Chat (default: one built-in), or prompts_file: a
    prompt file (JSONL or lines).
    kernels: "default" (the model as it is) or "batch-invariant" (nondet's kernels).
    require: "identical" or one of "max-distinct = N", "min-divergence-step = S",
    "max-logprob-diff = X" (see nondet gate). Returns the verdicts when the policy is met.
    """
    from nondet.probes.inmemory import probe_model
    from nondet.probes.probe import ProbeConfig
    from nondet.gate.policy import Policy, evaluate
    from nondet.prompt import label

    policy = Policy.parse(require)
    if max(batch_sizes, default=1) <= 1:
        raise ValueError(f"batch_sizes={tuple(batch_sizes)} leaves no condition to compare with the reference "
                         "(the prompt alone at batch size 1): a policy over zero conditions proves nothing; "
                         "give a size > 1, e.g. batch_sizes=(1, 8)")
    verdicts = []
    for prompt in prompts_of(prompts, prompts_file):
        config = ProbeConfig(prompt=prompt, batch_sizes=tuple(sorted({1, *batch_sizes})),
                             max_new_tokens=max_new_tokens, kernels=(kernels,))
        result = probe_model(model, tokenizer, config)
        verdicts.append(evaluate(result.summary, result.streams, policy, name=f"prompt {label(prompt)[:60]!r}"))
    failed = [v for v in verdicts if not v.passed]
    if failed:
        raise AssertionError(failure_message(failed))
    return verdicts


def prompts_of(prompts: "Sequence[Prompt] | None", prompts_file: Path | str | None) -> "Sequence[Prompt]":
    """The prompts given, or those of prompts_file read as every command reads one (nondet/prompt_file.py)."""
    if prompts_file is None:
        if prompts is not None and not prompts:
            raise ValueError("prompts is empty: nothing would be probed, and an assertion over nothing proves "
                             "nothing; give at least one prompt (or leave prompts out for the built-in one)")
        return DEFAULT_PROMPTS if prompts is None else prompts
    if prompts is not None:
        raise ValueError("give either prompts or prompts_file, not both")
    from nondet.prompt_file import read_prompt_file

    return read_prompt_file(prompts_file)


def failure_message(verdicts) -> str:
    """'batch-variant under policy identical:' then one line per failing condition."""
    lines = [f"batch-variant under policy {verdicts[0].policy.describe()}:"]
    for v in verdicts:
        for c in v.failures:
            lines.append(f"  {v.name}, {c.condition_id}: {c.message}")
    return "\n".join(lines)


def assert_speculative_equivalent(model, tokenizer, prompts: Sequence[str] | None = None, k: int = 4,
                                  forms: Sequence[str] = ("self",), max_new_tokens: int = 64,
                                  kernels: str = "default", prompts_file: Path | str | None = None) -> list[dict]:
    """Speculative decoding of each prompt must equal plain greedy decoding, token and logprob bits.

    forms: "self" (the model as its own draft: every token through the k+1 verification pass),
    "ngram" (prompt lookup), each drafting k tokens a round; or full forms ("draft:DIR:2").
    kernels: "default" or "batch-invariant"; prompts_file as in assert_batch_invariant.
    AssertionError naming the prompt, the form and the first differing step; returns one
    {"prompt", "form", "steps", "acceptance_rate"} per pair.

        assert_speculative_equivalent(model, tokenizer, prompts=["Tell me about Feynman"], k=4,
                                      kernels="batch-invariant")
    """
    from nondet.probes.probe import ProbeConfig

    names = tuple(f if ":" in f else f"{f}:{k}" for f in forms)
    if not names:
        raise ValueError("forms is empty: no speculative form to compare with plain greedy decoding, and an "
                         "assertion over no comparison proves nothing; give e.g. forms=(\"self\",)")
    failures, passed = [], []
    for prompt in prompts_of(prompts, prompts_file):
        config = ProbeConfig(prompt=prompt, batch_sizes=(1,), max_new_tokens=max_new_tokens, kernels=(kernels,),
                             speculative=names)
        streams = _speculative_streams(model, tokenizer, config)
        reference = next(s for s in streams if s["is_reference"])
        for stream in (s for s in streams if not s["is_reference"]):
            step = first_difference(reference["steps"], stream["steps"])
            entry = {"prompt": prompt, "form": stream["speculative"], "steps": len(stream["steps"]),
                     "acceptance_rate": stream.get("acceptance_rate")}
            (passed if step is None else failures).append(entry if step is None else
                                                          _difference(entry, step, reference, stream))
    if failures:
        raise AssertionError(f"speculative decoding differs from plain greedy decoding (kernels {kernels}):\n"
                             + "\n".join(failures))
    return passed


def _speculative_streams(model, tokenizer, config) -> list[dict]:
    """The speculative source on (model, tokenizer) in memory: plain greedy + each form."""
    from nondet.probes.models.loading import LoadedModel
    from nondet.probes.core.numerics import numerics_scope
    from nondet.probes.probe import run_streams, validate_config
    from nondet.probes.speculative.source import SpeculativeSource

    validate_config(config)
    source = SpeculativeSource(config, LoadedModel(model, tokenizer, description={}))
    with numerics_scope(config.threads):
        source.open()
        try:
            return run_streams(source, None)
        finally:
            source.close()


def first_difference(reference: list[dict], steps: list[dict]) -> int | None:
    """The first step whose token or logprob bits differ (or where one stream ends early)."""
    for i, (ref, own) in enumerate(zip(reference, steps)):
        if (ref["token"], ref["logprob"]) != (own["token"], own["logprob"]):
            return i
    return None if len(reference) == len(steps) else min(len(reference), len(steps))


def _difference(entry: dict, step: int, reference: dict, stream: dict) -> str:
    """'  prompt 'Tell me...', form self:4: first differing step 1: logprob bits ... (same token)'."""
    where = f"  prompt {entry['prompt'][:60]!r}, form {entry['form']}: first differing step {step}"
    if step >= min(len(reference["steps"]), len(stream["steps"])):
        return f"{where}: {len(stream['steps'])} steps vs plain greedy's {len(reference['steps'])}"
    ref, own = reference["steps"][step], stream["steps"][step]
    if ref["token"] != own["token"]:
        return f"{where}: token {own.get('piece', own['token'])!r} vs plain greedy's {ref.get('piece', ref['token'])!r}"
    return f"{where}: logprob bits {own['logprob']} vs plain greedy's {ref['logprob']} (same token)"


@pytest.fixture(name="assert_speculative_equivalent")
def _assert_speculative_equivalent_fixture():
    """The assert_speculative_equivalent helper, as a fixture."""
    return assert_speculative_equivalent


@pytest.fixture(name="assert_batch_invariant")
def _assert_batch_invariant_fixture():
    """The assert_batch_invariant helper, as a fixture."""
    return assert_batch_invariant
