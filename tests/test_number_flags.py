"""Numbers a comparison cannot reject: nan passes `x < 0` and `x <= 0`, so --temperature nan sampled from NaN
logits (exit 0) and nondet rl loaded its model before failing (exit 70). Each refusal names its flag and value;
the control is the same setting at a valid value."""

import math

import pytest

from nondet.errors import UsageError
from nondet.probes.probe import ProbeConfig, validate_config
from nondet.rl.config import RLConfig, validate


@pytest.mark.parametrize("temperature", [math.nan, math.inf, -1.0])
def test_probe_refuses_a_temperature_that_is_not_a_number_at_least_0(temperature):
    with pytest.raises(UsageError, match=f"^--temperature must be a number >= 0 \\(0: greedy\\), not {temperature}$"):
        validate_config(ProbeConfig(temperature=temperature))
    validate_config(ProbeConfig(temperature=0.7))


@pytest.mark.parametrize("budget", [math.nan, math.inf, 0.0])
def test_probe_refuses_a_budget_that_is_not_a_positive_number(budget):
    with pytest.raises(UsageError, match=f"^--budget must be a number of seconds > 0, not {budget}$"):
        validate_config(ProbeConfig(budget=budget))
    validate_config(ProbeConfig(budget=30.0))


@pytest.mark.parametrize("settings, said", [
    ({"temperature": math.nan}, "--temperature must be a number > 0, not nan"),
    ({"temperature": -1.0}, "--temperature must be a number > 0, not -1.0"),
    ({"top_k": -1}, "--top-k must be >= 0 (0: off), not -1"),
    ({"top_p": 0.0}, "--top-p must be in (0, 1], not 0.0"),
    ({"top_p": math.nan}, "--top-p must be in (0, 1], not nan"),
    ({"max_new_tokens": 0}, "--max-new-tokens must be >= 1, not 0"),
    ({"sampler_batch": 0}, "--sampler-batch must be >= 1, not 0"),
])
def test_rl_names_the_one_setting_that_is_wrong(settings, said):
    with pytest.raises(UsageError, match=f"^{__import__('re').escape(said)}$"):
        validate(RLConfig(**settings))
    validate(RLConfig())  # the control: the defaults


def test_rl_checks_its_endpoint_before_the_model_loads():
    with pytest.raises(UsageError, match="^--endpoint 'http://127.0.0.1:99999': the port must be a number from 1"):
        validate(RLConfig(endpoint="http://127.0.0.1:99999"))
    validate(RLConfig(endpoint="http://127.0.0.1:8000"))  # the control
