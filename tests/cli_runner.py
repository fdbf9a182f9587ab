"""`python -m nondet ARGS` for the tests, forked from a server that has already imported the heavy modules.

Every CLI test used to start a fresh interpreter, and each paid ~3.5 s of CPU importing torch and
transformers before nondet ran: over a hundred calls, a large part of the suite on 2 cores. Here
each call is still its own process (its own exit code, stdout, stderr, environment, working
directory; nothing it does stays in the test's process), forked from multiprocessing's forkserver
with those modules preloaded (PRELOAD). The server imports but never computes, so no thread pool
is forked half-used.

A call whose environment differs from the server's in a variable an import reads (ATEN_CPU_CAPABILITY,
TRITON_INTERPRET, thread counts, HF_*, ...: anything outside SAFE_ENV) goes through a real
subprocess, since the server's imports already read theirs. NONDET_TEST_SUBPROCESS=1 sends every
call through a real subprocess (to rule the fork server out).
"""

import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile

# variables nondet reads when it runs (not when torch / transformers / triton are imported). Also three
# that libraries set in the test process as they run and read again when used, never at import:
# TOKENIZERS_PARALLELISM (transformers' compiled generate sets it), TORCHINDUCTOR_CACHE_DIR and
# _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR (Inductor sets them while it compiles): with one set, every
# later call of that worker fell back to a real subprocess (the suite took 568 s instead of 401 s).
SAFE_ENV_PREFIXES = ("NONDET_", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TERM", "PYTEST_", "GITHUB_",
                     "TOKENIZERS_PARALLELISM", "TORCHINDUCTOR_CACHE_DIR",
                     "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR")
# imported once by the fork server (module names: the server does not see the tests' sys.path). Past
# torch and transformers, what a command imports when it runs (its CLI module, the probe, the reports'
# pandas / pyarrow): 1.3 s -> 0.5 s of CPU for a tiny probe. nondet reads no variable at
# import time, so its modules are as safe to preload as the libraries.
PRELOAD = ["torch", "transformers", "transformers.modeling_utils", "transformers.models.auto.modeling_auto",
           "transformers.models.auto.tokenization_auto", "transformers.masking_utils", "transformers.processing_utils",
           "pandas", "pyarrow", "rich.console",
           "nondet.cli.app", "nondet.cli.probe", "nondet.cli.bisect", "nondet.cli.gate", "nondet.cli.report",
           "nondet.cli.rl", "nondet.cli.kernels", "nondet.cli.compare", "nondet.probes.probe", "nondet.reports"]
_SERVER = {"context": None, "env": None}


def run(args, env: dict | None = None, cwd=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m nondet *args` with stdout / stderr captured as text, as subprocess.run would give
    them. env: the whole environment (default: this process's)."""
    env = dict(os.environ if env is None else env)
    argv = ["nondet", *map(str, args)]
    if os.environ.get("NONDET_TEST_SUBPROCESS") == "1" or not _forkable(env):
        return subprocess.run([sys.executable, "-m", "nondet", *argv[1:]], capture_output=True, text=True,
                              env=env, cwd=cwd, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="nondet-cli-") as scratch:
        out, err = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
        process = _context().Process(target=_child, args=(argv, env, None if cwd is None else str(cwd), out, err))
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(argv, timeout)
        return subprocess.CompletedProcess(argv, process.exitcode, _read(out), _read(err))


def _forkable(env: dict) -> bool:
    """Whether the server's imports read what this call's environment says."""
    _context()
    server = _SERVER["env"]
    changed = {k for k in set(env) | set(server) if env.get(k) != server.get(k)}
    return all(k.startswith(SAFE_ENV_PREFIXES) for k in changed)


def _context():
    if _SERVER["context"] is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        _SERVER["context"], _SERVER["env"] = context, dict(os.environ)
    return _SERVER["context"]


def _child(argv: list[str], env: dict, cwd: str | None, out: str, err: str) -> None:
    """In the forked process: the environment, the directory, fds 1 and 2 onto files, then nondet as
    `python -m nondet` runs it (its SystemExit is the process's exit code)."""
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(handle, fd)
        os.close(handle)
    sys.argv = argv
    runpy.run_module("nondet", run_name="__main__", alter_sys=True)


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def in_process(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    """`nondet ARGS` in the test's own process, through main()'s error boundary: (exit code, stdout, stderr).
    For fast checks of one-line errors; run() where a call must not touch the test's process."""
    from nondet.cli.app import main

    monkeypatch.setattr(sys, "argv", ["nondet", *map(str, args)])
    monkeypatch.delenv("NONDET_DEBUG", raising=False)
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err
