"""A flag the chosen source would not read is refused in one line (probes/unread_flags.py), and the same
flag on a source that reads it is accepted: each refusal below has its control beside it."""

import os
import re

import pytest

import cli_runner
from nondet.errors import UsageError
from nondet.probes.core.load_config import LoadConfig
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, validate_config
from nondet.probes.unread_flags import RULES, source_kind

SERVER = LoadConfig(mode="server", endpoint="http://127.0.0.1:9")
CONTINUOUS = LoadConfig(mode="continuous")

# (config whose source does not read the flags, the flags named, the same fields where a source reads them)
CASES = [
    (ProbeConfig(load=LoadConfig(rate=3.0, concurrency=5, filler_requests=7, tokenizer="/x", timeout=1.0)),
     "--rate, --concurrency, --filler-requests, --tokenizer, --timeout do not apply to static batches",
     ProbeConfig(load=LoadConfig(mode="server", endpoint="http://h", rate=3.0, concurrency=5, filler_requests=7,
                                 tokenizer="/x", timeout=1.0))),
    (ProbeConfig(load=CONTINUOUS, batch_sizes=(1, 2, 8), placement="ends", ragged=True),
     "--batch-sizes, --positions, --ragged do not apply to --load continuous",
     ProbeConfig(batch_sizes=(1, 2, 8), placement="ends", ragged=True)),
    (ProbeConfig(speculative=("ngram:2",), batch_sizes=(1,), placement="ends", runs=3, fillers=("a", "b")),
     "--positions, --runs, --fillers do not apply to --speculative",
     ProbeConfig(placement="ends", runs=3, fillers=("a", "b"))),
    (ProbeConfig(load=SERVER, threads=1, model=ModelSpec(dtype="float32", attn_implementation="eager",
                                                          inject_variance=True), allow_uncovered=True),
     "--threads, --dtype, --attn-implementation, --inject-variance / --no-inject-variance, --allow-uncovered "
     "do not apply to --endpoint",
     ProbeConfig(threads=1, model=ModelSpec(dtype="float32", attn_implementation="eager", inject_variance=True),
                 allow_uncovered=True)),
    (ProbeConfig(load=SERVER, prefill=("prefix:auto",), kernels=("batch-invariant",), runs=5),
     "--runs, --kernels / --confirm do not apply to --endpoint with --prefix-cache",
     ProbeConfig(prefill=("prefix:auto",), kernels=("batch-invariant",), runs=5, batch_sizes=(1,))),
    (ProbeConfig(load=LoadConfig(mode="server", resume="/tmp/run"), runs=4),
     "--runs does not apply to --resume",
     ProbeConfig(load=SERVER, runs=4)),
]


@pytest.mark.parametrize("unread, message, read", CASES, ids=lambda v: source_kind(v) if isinstance(v, ProbeConfig)
                         else "")
def test_a_flag_its_source_does_not_read_is_refused_and_accepted_where_read(unread, message, read):
    with pytest.raises(UsageError) as refused:
        validate_config(unread)
    assert str(refused.value).startswith(message) and str(refused.value).endswith("; drop them" if "do not" in
                                                                                    message else "; drop it")
    validate_config(read)  # the control: the same fields on a source that reads them


def test_every_rule_names_a_field_and_sources_that_exist():
    kinds = {"static", "tp", "speculative", "continuous", "server", "against", "server-prefix", "server-resume"}
    for flag, path, readers in RULES:
        owner = ProbeConfig()
        for part in path.split("."):
            owner = getattr(owner, part)  # raises where a rule names no field
        assert readers and set(readers) <= kinds, flag


def test_the_cli_refuses_in_one_line_with_exit_2(tmp_path):
    r = cli_runner.run(("probe", "--endpoint", "http://127.0.0.1:9", "--inject-variance", "-n", "2",
                        "--out", str(tmp_path / "r")), env=dict(os.environ), timeout=120)
    assert (r.returncode, r.stderr) == (2, "nondet: error: --inject-variance / --no-inject-variance does not "
                                           "apply to --endpoint (the server runs its own model, dtype and "
                                           "kernels); drop it\n")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags, refused", [
    ({"rl": "identical", "compile": True}, "--compile applies to the batch and speculative axes, which this gate "
                                           "does not run (axes: rl)"),
    ({"rl": "identical", "positions": "last"}, "--positions applies to the batch axis"),
    ({"speculative-forms": "ngram:2", "prefix-cache": "2"}, "--prefix-cache applies to the batch axis"),
    ({"speculative-forms": "ngram:2", "workers": 2}, "--workers applies to the batch axis"),
    ({"require": "identical", "micro-batch": "1,4"}, "--micro-batch applies to the rl axis"),
])
def test_the_gate_refuses_a_key_no_axis_it_runs_reads(flags, refused):
    from nondet.gate.config import resolve

    with pytest.raises(UsageError, match=f"^{re.escape(refused)}"):
        resolve(flags, {})
    both = {**flags, "require": "identical", "rl": "identical", "speculative-forms": "ngram:2"}
    assert set(resolve(both, {}).axes) == {"batch", "speculative", "rl"}  # the control: an axis that reads it


@pytest.mark.parametrize("sampler, unread, message", [
    ({"load": "continuous"}, {"sampler_batch": 2}, "--sampler-batch does not apply to --load continuous"),
    ({"endpoint": "http://h"}, {"sampler_batch": 2, "exact_kl": False},
     "--sampler-batch, --no-exact-kl do not apply to --endpoint (the server samples)"),
    ({"rollouts": "r.jsonl"}, {"max_new_tokens": 4, "seed": 3, "exact_kl": False},
     "--max-new-tokens, --seed, --no-exact-kl do not apply to --rollouts (nothing is sampled here)"),
])
def test_rl_refuses_a_sampler_setting_its_sampler_does_not_read(sampler, unread, message):
    from nondet.rl.config import RLConfig, validate

    with pytest.raises(UsageError, match=f"^{re.escape(message)}"):
        validate(RLConfig(**sampler, **unread))
    validate(RLConfig(**sampler))  # the control: the defaults are no choice
    validate(RLConfig(**unread))  # and nondet's own batched sampler reads them all
