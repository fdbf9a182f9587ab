"""`transformers serve` of a model saved to a temp dir, on a free loopback port, for tests that need a
real OpenAI-compatible server: its own log and hub cache, stopped by its process id (also when the
test fails)."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

HEALTH_WAIT_S = 180  # model load and warm-up on a busy 2-core CI machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_command(model_dir: Path, port: int, continuous: bool) -> list[str]:
    exe = Path(sys.executable).with_name("transformers")
    exe = str(exe) if exe.exists() else shutil.which("transformers")
    assert exe, "the `transformers` command is missing: install the serving extra (scripts/setup.sh)"
    # A small paged KV cache: left to itself on CPU, the engine sizes it from system memory (GBs).
    batching = ["--continuous-batching", "--cb-block-size", "64", "--cb-num-blocks", "256",
                "--cb-max-batch-tokens", "512"] if continuous else []
    return [exe, "serve", str(model_dir), "--device", "cpu", *batching,
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]


@contextlib.contextmanager
def transformers_serve(model_dir: Path, workdir: Path, continuous: bool = True):
    """A `transformers serve` of model_dir on a free loopback port (its own log and hub cache in
    workdir); yields its base URL; stops it by process id."""
    workdir.mkdir(parents=True, exist_ok=True)
    port, log_path = _free_port(), workdir / "serve.log"
    hub = workdir / "hub"  # its /v1/models scans the hub cache and answers 500 when there is none
    hub.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub)}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(_serve_command(model_dir, port, continuous), stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc, log_path)
        yield url
    finally:
        _stop(proc)


def _wait_healthy(url: str, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + HEALTH_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"transformers serve exited with {proc.returncode}:\n{log_path.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(1)
    pytest.fail(f"transformers serve did not answer /health within {HEALTH_WAIT_S} s:\n{log_path.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)
