"""Triton's compiled kernels live under NONDET_CACHE/triton for every command (cache_dir.triton_cache), so a CI
workflow that keeps nondet's cache keeps the batch-invariant kernels' binaries; a TRITON_CACHE_DIR the user set is
kept, and the variable is restored after."""

import os

from nondet.probes.core.cache_dir import TRITON_CACHE_ENV, triton_cache


def test_the_scope_names_nondets_folder_and_restores(monkeypatch, tmp_path):
    monkeypatch.setenv("NONDET_CACHE", str(tmp_path))
    monkeypatch.delenv(TRITON_CACHE_ENV, raising=False)
    with triton_cache():
        assert os.environ[TRITON_CACHE_ENV] == str(tmp_path / "triton")
    assert TRITON_CACHE_ENV not in os.environ


def test_the_users_folder_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("NONDET_CACHE", str(tmp_path))
    monkeypatch.setenv(TRITON_CACHE_ENV, "/their/own")
    with triton_cache():
        assert os.environ[TRITON_CACHE_ENV] == "/their/own"
    assert os.environ[TRITON_CACHE_ENV] == "/their/own"


def test_every_command_runs_in_the_scope(monkeypatch, tmp_path):
    """The CLI's one boundary (cli/app.main) runs the command inside the scope. Control: outside it the variable
    is unset."""
    from nondet.cli import app

    monkeypatch.setenv("NONDET_CACHE", str(tmp_path))
    monkeypatch.delenv(TRITON_CACHE_ENV, raising=False)
    seen = []
    monkeypatch.setattr(app, "_register_commands", lambda: None)
    monkeypatch.setattr(app, "app", lambda standalone_mode: seen.append(os.environ.get(TRITON_CACHE_ENV)))
    app.main()
    assert seen == [str(tmp_path / "triton")] and TRITON_CACHE_ENV not in os.environ
