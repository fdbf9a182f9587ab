"""The pytest plugin: loaded by entry point, no torch at import, fails and passes real models."""

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET



USER_TESTS = textwrap.dedent('''
    import pytest
    from nondet.probes.models.loading import ModelSpec, load_model

    @pytest.fixture(scope="module")
    def loaded():
        # the embedded demo model, in memory, with one norm made batch-variant on purpose: the
        # positive control fires on every host, whatever its BLAS does
        return load_model(ModelSpec(inject_variance=True))

    def test_default_kernels(loaded, assert_batch_invariant):
        assert_batch_invariant(loaded.model, loaded.tokenizer, batch_sizes=(1, 8), max_new_tokens=24)

    def test_batch_invariant_kernels(loaded, assert_batch_invariant):
        assert_batch_invariant(loaded.model, loaded.tokenizer, batch_sizes=(1, 8), max_new_tokens=24,
                               kernels="batch-invariant")
''')


def run_pytest(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900, env=dict(os.environ))


def test_plugin_imports_no_torch():
    code = "import sys, nondet.pytest_plugin; print([m for m in ('torch', 'transformers') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_plugin_is_registered_by_entry_point(tmp_path):
    (tmp_path / "test_fixture.py").write_text(
        "def test_fixture(assert_batch_invariant):\n"
        "    from nondet.pytest_plugin import assert_batch_invariant as helper\n"
        "    assert assert_batch_invariant is helper\n")
    r = run_pytest(tmp_path, "-q", "test_fixture.py")
    assert r.returncode == 0, r.stdout + r.stderr


def test_fails_on_default_kernels_and_passes_with_the_mode(tmp_path, default_model_dir):
    (tmp_path / "test_model.py").write_text(USER_TESTS)
    r = run_pytest(tmp_path, "-q", "--junitxml=results.xml", "test_model.py")
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "results.xml").getroot().iter("testcase")}
    failure = cases["test_default_kernels"].find("failure")
    assert failure is not None, r.stdout
    assert failure.get("message").startswith(
        "AssertionError: batch-variant under policy identical:\n"
        "  prompt 'Tell me about Richard Feynman', default/bs8/ends: ")
    assert "differ" in failure.get("message")  # tokens or logprob bits, whichever came first
    assert "AssertionError: batch-variant under policy identical:" in r.stdout  # the test report shows it
    assert list(cases["test_batch_invariant_kernels"]) == [], r.stdout  # no failure, no error
    assert r.returncode == 1  # exactly the default-kernels test failed
