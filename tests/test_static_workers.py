"""--workers: a static probe's conditions decoded by several processes (probes/static/workers.py).

The run directory must be the one a single process writes (streams, run ids and condition records
byte for byte), the positive control must still fire through the helpers, the mode must still give
one completion, and a helper that dies must stop the run with one line."""

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from nondet.errors import UsageError, WorkerError
from nondet.probes.core.load_config import LoadConfig
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe, validate_config
from nondet.probes.static import workers

PROMPTS = ("The capital of France is", "One two three four five", "Zebra crossing near the old")


def _config(model_dir, out, n: int, inject: bool = False, **fields) -> ProbeConfig:
    return ProbeConfig(prompts=PROMPTS, model=ModelSpec(str(model_dir), "float32", inject_variance=inject),
                       batch_sizes=(1, 2, 3), max_new_tokens=12, threads=1, workers=n, out=str(out), **fields)


def _files(run_dir) -> tuple[str, str]:
    return (run_dir / "streams.jsonl").read_text(), (run_dir / "conditions.jsonl").read_text()


@pytest.fixture
def helpers_only(monkeypatch):
    """Every condition to the helpers: the parent would otherwise finish a tiny sweep before they load."""
    monkeypatch.setattr(workers, "PARENT_DECODES", False)


def test_helpers_write_the_run_directory_one_process_writes(tiny_model_dir, tmp_path, helpers_only):
    one = run_probe(_config(tiny_model_dir, tmp_path / "one", 1, inject=True))
    three = run_probe(_config(tiny_model_dir, tmp_path / "three", 3, inject=True))
    decoded = three.summary["workers"]["conditions_decoded"]
    conditions = len((tmp_path / "one" / "conditions.jsonl").read_text().splitlines())
    assert decoded[0] == 0 and sum(decoded) == conditions  # every condition came from a helper (one may take all)
    assert _files(tmp_path / "three") == _files(tmp_path / "one")
    assert "workers" not in one.summary
    # positive control through the helpers: the injected norm makes batched rows differ from the reference
    streams = [json.loads(line) for line in _files(tmp_path / "three")[0].splitlines()]
    reference = {s["prompt_id"]: s for s in streams if s["is_reference"]}
    assert any(s["steps"] != reference[s["prompt_id"]]["steps"] for s in streams if not s["is_reference"])
    fingerprint = json.loads((tmp_path / "three" / "fingerprint.json").read_text())
    assert fingerprint["workers"] == 3 and fingerprint["threads"] == 1


def test_the_mode_decoded_by_helpers_gives_one_completion(tiny_model_dir, tmp_path, helpers_only):
    result = run_probe(_config(tiny_model_dir, tmp_path / "mode", 2, inject=True, kernels=("batch-invariant",)))
    streams = [json.loads(line) for line in _files(tmp_path / "mode")[0].splitlines()]
    for prompt_id in range(len(PROMPTS)):
        mine = [s["steps"] for s in streams if s["prompt_id"] == prompt_id]
        assert len(mine) > 1 and all(steps == mine[0] for steps in mine)
    assert result.summary["workers"]["conditions_decoded"][1] > 0


def test_parent_and_helper_share_the_plan(tiny_model_dir, tmp_path):
    """Without the test knob: whoever decodes what, the run directory is one process's."""
    run_probe(_config(tiny_model_dir, tmp_path / "one", 1))
    both = run_probe(_config(tiny_model_dir, tmp_path / "two", 2))
    conditions = len((tmp_path / "one" / "conditions.jsonl").read_text().splitlines())
    assert sum(both.summary["workers"]["conditions_decoded"]) == conditions
    assert _files(tmp_path / "two") == _files(tmp_path / "one")


def test_a_helper_that_dies_stops_the_run_with_one_line(tiny_model_dir, tmp_path, helpers_only, monkeypatch):
    monkeypatch.setenv(workers.FAIL_ENV, "1")
    with pytest.raises(WorkerError, match=r"worker process 1 died \(exit code 17\)"):
        run_probe(_config(tiny_model_dir, tmp_path / "dies", 2))


@pytest.mark.parametrize("fields", [
    dict(workers=0), dict(compile_backend="inductor"), dict(tp=(1, 2)),
    dict(load=LoadConfig(mode="continuous")), dict(model=ModelSpec(device="cuda")),
])
def test_workers_outside_eager_static_cpu_batches_are_refused(fields):
    config = replace(ProbeConfig(workers=2), **fields)
    with pytest.raises(UsageError, match="--workers"):
        validate_config(config)


def test_threads_per_worker():
    assert workers.threads_per_worker(3, 2) == 3  # asked for: kept
    assert workers.threads_per_worker(None, 1) is None  # one process: torch's default
    assert workers.threads_per_worker(None, 10_000) == 1  # more workers than cores: one thread each


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_threads_per_worker_counts_the_cores_this_process_may_use(monkeypatch):
    # a runner's cpuset (taskset, a container) smaller than the host: the host's count would oversubscribe
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    assert workers.threads_per_worker(None, 2) == 2
    assert workers.threads_per_worker(None, 4) == 1


def test_gate_and_probe_take_workers_from_flags_and_config(tiny_model_dir, tmp_path):
    import cli_runner

    from nondet.gate.config import load_config, resolve

    (tmp_path / ".git").mkdir()
    (tmp_path / "nondet.toml").write_text("workers = 2\nthreads = 1\n")
    assert resolve({}, load_config(tmp_path / "nondet.toml"), tmp_path / "nondet.toml").workers == 2
    argv = ["gate", "--model", str(tiny_model_dir), "--dtype", "float32", "-b", "1,2", "-n", "4", "--no-bisect",
            "--out", "run", *[arg for p in PROMPTS for arg in ("--prompt", p)]]
    r = cli_runner.run(argv, cwd=tmp_path, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    assert json.loads((tmp_path / "run" / "fingerprint.json").read_text())["workers"] == 2
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["workers"]["processes"] == 2
    r = cli_runner.run(["probe", "--workers", "0", "--out", "never"], cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "--workers must be an integer >= 1 or auto" in r.stderr and "Traceback" not in r.stderr


def test_ctrl_c_stops_the_helpers_with_the_one_line(tiny_model_dir, tmp_path):
    """A shell's Ctrl-C reaches the whole process group: parent and helpers. One line, exit 130, no helper left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "r"
    env = {k: v for k, v in os.environ.items() if k != "NONDET_DEBUG"}
    proc = subprocess.Popen([sys.executable, "-m", "nondet", "probe", "--model", str(tiny_model_dir), "--workers", "2",
                             "-p", PROMPTS[0], "-n", "400", "-b", "1-8", "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a shell
    deadline = time.monotonic() + 120
    while not (out / "streams.jsonl").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    helpers = [pid for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert proc.poll() is None and helpers, "finished, or no helper started, before the interrupt"
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr == (f"nondet: error: interrupted; streams already written stay in {out}, an unfinished run "
                      "directory\n")
    time.sleep(1.0)  # reparented helpers are reaped by init
    assert not [pid for pid in helpers if Path(f"/proc/{pid}").exists()
                and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]


def test_a_model_in_memory_is_not_handed_to_helpers(tiny_model_dir):
    """Helpers load config.model; the in-memory probe's model is the caller's: refused, not silently another model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nondet.probes.inmemory import probe_model

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(UsageError, match="--workers loads the model in every process"):
        probe_model(model, AutoTokenizer.from_pretrained(tiny_model_dir), ProbeConfig(prompts=PROMPTS, workers=2))
