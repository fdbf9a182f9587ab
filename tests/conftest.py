"""Shared fixtures. The default model is built into a per-session temp cache (never ~/.cache)."""

import os
import tempfile

import pytest

_CACHE = tempfile.mkdtemp(prefix="nondet-test-cache-")
os.environ.setdefault("NONDET_CACHE", _CACHE)
# the default model of tests is the random-weight demo (fast, every test's expectations are set on it);
# tests/test_demo_trained.py runs the trained one end to end
os.environ.setdefault("NONDET_DEMO_MODEL", "random")
# the CLI runs as on a pipe, whatever runs the tests: pytest-xdist's workers (and readline, where it is
# loaded) export the terminal's COLUMNS / LINES, which would fold the tables. tests/test_columns80.py
# sets COLUMNS itself.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


@pytest.fixture(scope="session")
def default_model_dir():
    from nondet.probes.models.default_model import default_model_dir as build

    return build()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen3 + tokenizer saved with save_pretrained: the real loading path."""
    from model_fixtures import save_qwen3

    from nondet.probes.models.default_model import build_tokenizer

    return save_qwen3(tmp_path_factory.mktemp("tiny-qwen3"), build_tokenizer(512), hidden=64, layers=2, heads=4,
                      kv_heads=2, seed=1)


@pytest.fixture(scope="session")
def tiny_chat_model_dir(tmp_path_factory):
    """tiny_model_dir's model with a chat template (model_fixtures.CHAT_TEMPLATE) in its tokenizer."""
    from model_fixtures import CHAT_TEMPLATE, save_qwen3

    from nondet.probes.models.default_model import build_tokenizer

    tokenizer = build_tokenizer(512)
    tokenizer.chat_template = CHAT_TEMPLATE
    return save_qwen3(tmp_path_factory.mktemp("tiny-chat-qwen3"), tokenizer, hidden=64, layers=2, heads=4,
                      kv_heads=2, seed=1)


def pytest_terminal_summary(terminalreporter):
    """Count the invariance tests that proved nothing on this host: their control did not fire
    (tests/controls.py require_variance), so they were skipped."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    from controls import control_skips

    found = control_skips(skipped)
    if found:
        terminalreporter.write_sep("-", f"{len(found)} invariance test(s) skipped: the host's default kernels are "
                                        "invariant on their case")
        for nodeid, reason in found:
            terminalreporter.write_line(f"{nodeid}: {reason}")
