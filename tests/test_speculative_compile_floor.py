"""`probe --speculative --compile` across the transformers versions pyproject.toml allows (>=5.17).

Before 5.24 transformers' assisted generation refuses a static cache ("assisted generate is not
supported with Static cache classes"), which it raised at the first speculative condition, after the
plain reference had compiled. The probe now refuses the pair up front, in one line naming the version
(exit 2), as the config is validated: before the model loads, and for the gate before its batch axis runs
(static_caches.refuse_compiled_speculation, called by probe.validate_config).
Positive: probe and gate on the installed version when it is older than 5.24 (scripts/test_floor.sh runs
them on 5.17), and the check with the version monkeypatched, on any version. Negative: on 5.24 and later the
same probe decodes every condition on the compiled path (tests/test_probe_compile.py).
"""


import pytest

from nondet.errors import UsageError
from nondet.probes.core import static_caches
from nondet.probes.core.static_caches import reusable_static_cache
import cli_runner

PROMPT = "Tell me about Richard Feynman"


def refusal(version: str) -> str:
    return (f"--speculative with --compile needs transformers 5.24 or later (installed {version}: its assisted "
            "generation refuses a static cache); pip install 'transformers>=5.24,<6', or rerun without --compile")


@pytest.mark.skipif(reusable_static_cache(), reason="transformers 5.24 or later decodes speculatively compiled")
@pytest.mark.parametrize("command", [["probe", "--speculative", "self:2"], ["gate", "--speculative", "ngram:2"]])
def test_cli_refuses_speculative_compile_before_5_24_in_one_line(tmp_path, command):
    import transformers

    out = tmp_path / "r"
    r = cli_runner.run([*command, "-p", PROMPT, "-n", "4", "--compile", "--out", str(out)], timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == f"nondet: error: {refusal(transformers.__version__)}\n"
    assert not out.exists()


def test_the_refusal_names_the_version_and_comes_before_the_model_loads(tmp_path, monkeypatch):
    import transformers

    from nondet.probes.probe import ProbeConfig, run_probe
    from nondet.probes.speculative import source as speculative

    def never(spec):
        raise AssertionError("the model loaded before the refusal")

    monkeypatch.setattr(static_caches, "reusable_static_cache", lambda: False)  # as on 5.17-5.23
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    monkeypatch.setattr(speculative, "load_model", never)
    config = ProbeConfig(prompt=PROMPT, max_new_tokens=4, kernels=("default",), speculative=("self:2",),
                         compile_backend="aot_eager", out=str(tmp_path / "r"))
    with pytest.raises(UsageError) as raised:
        run_probe(config)
    assert str(raised.value) == refusal("5.17.0") and raised.value.exit_code == 2
    assert not (tmp_path / "r").exists()

