"""Shared fixtures. The default model is built into a per-session temp cache (never ~/.cache)."""

import atexit
import os
import shutil
import tempfile

import pytest


def _session_cache() -> None:
    """NONDET_CACHE for the session, where none is set: a temp folder made by the first process that imports
    this file (pytest-xdist's workers and the CLI's children inherit it) and removed when that process ends.
    Left behind, each run kept its models and compiled steps (827 folders, 12 GB on one machine by 2026-11-30)."""
    if "NONDET_CACHE" in os.environ:
        return
    cache = tempfile.mkdtemp(prefix="nondet-test-cache-")
    os.environ["NONDET_CACHE"] = cache
    atexit.register(shutil.rmtree, cache, ignore_errors=True)


_session_cache()
# the default model of tests is the random-weight demo (fast, every test's expectations are set on it);
# tests/test_demo_trained.py runs the trained one end to end
os.environ.setdefault("NONDET_DEMO_MODEL", "random")
# the CLI runs as on a pipe, whatever runs the tests: pytest-xdist's workers (and readline, where it is
# loaded) export the terminal's COLUMNS / LINES, which would fold the tables. tests/test_columns80.py
# sets COLUMNS itself.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


# Files started first by pytest-xdist (scripts/test.sh passes --dist loadfile --no-loadscope-reorder, so
# files are handed out in collection order): the longest, measured with --durations on a 2-core Xeon
# (2026-11-27; seconds of one worker among three). Left to collection order, an 85 s file started last
# ran alone for the last 100 s while the other core idled. Only the order changes, never the selection.
HEAVY_FIRST = (
    "test_kernels_attention_split.py",  # 85: the Triton interpreter
    "test_kernels_triton.py",  # 85: the Triton interpreter
    "test_tp.py",  # 79: two gloo ranks per run
    "test_family_matrix.py",  # 76
    "test_partial_utf8.py",  # 74
    "test_census_cli.py",  # 63
    "test_kernels_compile.py",  # 56: Inductor
    "test_probe_compile.py",  # 54: Inductor
    "test_kernels_ttgir.py",  # 43
    "test_confirm.py",  # 38
    "test_probe_rows.py",  # 38
    "test_exit_codes.py",  # 37
    "test_probe.py",  # 37
    "test_kernels_grouped.py",  # 37: the Triton interpreter
    "test_speculative_compiled_draft.py",  # 36
    "test_kernels_attention_features.py",  # 35: the Triton interpreter
)


def pytest_collection_modifyitems(items):
    """The HEAVY_FIRST files first, in that order; every other file after them, in collection order."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


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
