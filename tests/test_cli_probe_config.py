"""The one CLI helper that builds a ProbeConfig: the defaults probe, bisect and gate rely on."""

import sys

import pytest

from nondet.cli.gate import probe_configs
from nondet.cli.probe_config import build_load_config, build_probe_config
from nondet.errors import UsageError
from nondet.gate.config import resolve


def test_default_batch_sizes_depend_on_the_number_of_prompts():
    assert build_probe_config("probe", ("a",)).batch_sizes == (1, 2, 4, 8, 16)
    several = build_probe_config("probe", ("a", "b", "c"))
    assert several.batch_sizes == (1, 2, 8)
    assert (several.prompt, several.prompts) == ("a", ("a", "b", "c"))


def test_batch_sizes_typed_or_parsed_and_the_run_directory(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["nondet", "bisect", "-b", "2-4"])
    config = build_probe_config("bisect", ("a",), batch_sizes="2-4", inject_variance=True, max_new_tokens=7)
    assert config.batch_sizes == (1, 2, 3, 4) and config.model.inject_variance and config.max_new_tokens == 7
    assert config.argv == ("nondet", "bisect", "-b", "2-4")
    assert config.out.startswith("nondet-runs/") and config.out.endswith("-bisect")
    assert build_probe_config("gate", (), batch_sizes=(1, 8), out="run").batch_sizes == (1, 8)


def test_load_config_endpoint_or_resume_means_a_server():
    assert build_load_config("continuous").mode == "continuous"
    assert build_load_config("static", "http://127.0.0.1:8000", rate=2.0).mode == "server"
    assert build_load_config("static", None, "runs/r").resume == "runs/r"


def test_gate_builds_one_config_per_prompt():
    settings = resolve({"prompts": ["a", "b"], "endpoint": "http://h", "rate": 2.0}, {})
    configs = probe_configs(settings, "out")
    assert [(c.prompt, c.out) for c in configs] == [("a", "out/prompt-1"), ("b", "out/prompt-2")]
    assert all(c.load.mode == "server" and c.load.rate == 2.0 for c in configs)
    # a server's batches and threads are its own; sizes equal to the gate's default are a choice too
    for unread in ({"batch-sizes": "1,8"}, {"batch-sizes": "1,8,16"}, {"threads": 2}):
        with pytest.raises(UsageError, match="do(es)? not apply to --endpoint"):
            probe_configs(resolve({"prompts": ["a"], "endpoint": "http://h", **unread}, {}), "out")
    one = probe_configs(resolve({}, {}), "out")
    assert [(c.prompts, c.out, c.max_new_tokens, c.batch_sizes) for c in one] == [((), "out", 120, (1, 8, 16))]
