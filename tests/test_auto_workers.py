"""`--workers auto` (probes/static/auto_workers.py): the count follows the cores this process may use and
the memory free for another copy of the weights; 1 for a sweep too short to pay for the helpers' start-up,
wherever helpers cannot run, or where a size is unknown.
The CLI and the gate's config resolve it to a number before the probe runs (fingerprint.json says which)."""

import json
from dataclasses import replace

import pytest

from nondet.probes.core.load_config import LoadConfig
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig
from nondet.probes.static import auto_workers

GiB = 2**30


def _config(model_dir, **fields) -> ProbeConfig:
    """The CPU gate benchmark's work: 8 prompts x 300 tokens x batch sizes 1, 2, 4, 8 (15 calls at least)."""
    work = {"prompts": tuple(f"prompt {i}" for i in range(8)), "batch_sizes": (1, 2, 4, 8), "max_new_tokens": 300}
    return ProbeConfig(model=ModelSpec(str(model_dir), "bfloat16"), **{**work, **fields})


@pytest.fixture
def host(monkeypatch):
    """A host of `cores` cores and `free` bytes available (set on the returned dict)."""
    shape = {"cores": 2, "free": 64 * GiB}
    monkeypatch.setattr(auto_workers, "usable_cores", lambda: shape["cores"])
    monkeypatch.setattr(auto_workers, "available_memory", lambda: shape["free"])
    return shape


@pytest.mark.parametrize("cores, expected", [(1, 1), (2, 2), (4, 4), (8, 4), (16, 4), (64, 16)])
def test_auto_follows_the_cores(tiny_model_dir, host, cores, expected):
    host["cores"] = cores
    assert auto_workers.auto_count(_config(tiny_model_dir)) == expected


def test_a_short_sweep_keeps_one_process(tiny_model_dir, host):
    host["cores"] = 16
    assert auto_workers.decode_steps(_config(tiny_model_dir)) == 15 * 300
    assert auto_workers.auto_count(_config(tiny_model_dir)) == 4  # control: the long sweep gets helpers
    short = _config(tiny_model_dir, max_new_tokens=100)  # 1500 steps: ~3 s at 2 ms, about one helper's start-up
    assert auto_workers.auto_count(short) == 1
    one_prompt = _config(tiny_model_dir, prompts=(), prompt="Hello", batch_sizes=(1, 2))  # 2 calls x 300
    assert auto_workers.decode_steps(one_prompt) == 600 and auto_workers.auto_count(one_prompt) == 1
    both_modes = _config(tiny_model_dir, max_new_tokens=150, kernels=("default", "batch-invariant"))
    assert auto_workers.auto_count(both_modes) == 4  # 2 x 15 calls x 150 steps: as long as the first


def test_a_pinned_thread_count_caps_the_processes(tiny_model_dir, host):
    host["cores"] = 16
    assert auto_workers.auto_count(_config(tiny_model_dir, threads=2)) == 4  # 4 x 2 threads: 8 of 16 cores
    assert auto_workers.auto_count(_config(tiny_model_dir, threads=8)) == 2
    host["cores"] = 2
    assert auto_workers.auto_count(_config(tiny_model_dir, threads=2)) == 1  # 2 x 2 would oversubscribe
    assert auto_workers.auto_count(_config(tiny_model_dir, threads=1)) == 2


def test_auto_is_capped_by_the_memory_for_each_copy(tiny_model_dir, host, monkeypatch):
    host["cores"] = 64
    monkeypatch.setattr(auto_workers, "weights_bytes", lambda spec: 4 * GiB)
    per_process = 4 * GiB + auto_workers.PROCESS_OVERHEAD_BYTES
    host["free"] = int(3 * per_process / auto_workers.MEMORY_SHARE) + 1  # room for three copies
    assert auto_workers.auto_count(_config(tiny_model_dir)) == 3
    host["free"] = 2 * GiB  # not even one more copy: the one process
    assert auto_workers.auto_count(_config(tiny_model_dir)) == 1
    host["free"] = None  # unknown: one process
    assert auto_workers.auto_count(_config(tiny_model_dir)) == 1


def test_auto_is_one_where_helpers_cannot_run(tiny_model_dir, host):
    host["cores"] = 16
    base = _config(tiny_model_dir)
    assert auto_workers.auto_count(base) == 4  # control: the same host gives helpers to an eligible probe
    for other in (replace(base, compile_backend="inductor"), replace(base, budget=10.0),
                  replace(base, model=replace(base.model, device="cuda")),
                  replace(base, load=LoadConfig(mode="continuous"))):
        assert auto_workers.auto_count(other) == 1, other


def test_weights_are_counted_from_the_model_files(tiny_model_dir, tmp_path):
    stored = sum(f.stat().st_size for f in tiny_model_dir.glob("*.safetensors"))
    assert stored > 0
    assert auto_workers.weights_bytes(ModelSpec(str(tiny_model_dir), "bfloat16")) == stored
    assert auto_workers.weights_bytes(ModelSpec(str(tiny_model_dir), "float32")) == 2 * stored
    assert auto_workers.weights_bytes(ModelSpec(str(tmp_path), "bfloat16")) is None  # no weight files
    both = tmp_path / "both"  # a repository shipping both formats loads one: counted once
    both.mkdir()
    (both / "model.safetensors").write_bytes(b"0" * 1000)
    (both / "pytorch_model.bin").write_bytes(b"0" * 3000)
    assert auto_workers.weights_bytes(ModelSpec(str(both), "bfloat16")) == 1000
    (both / "model.safetensors").unlink()
    assert auto_workers.weights_bytes(ModelSpec(str(both), "bfloat16")) == 3000
    gguf = tmp_path / "gguf"  # dequantized on load: its size says nothing of the memory
    gguf.mkdir()
    (gguf / "model.gguf").write_bytes(b"0" * 1000)
    assert auto_workers.weights_bytes(ModelSpec(str(gguf), "bfloat16")) is None
    assert auto_workers.weights_bytes(ModelSpec("no-such-org/no-such-model", "bfloat16")) is None  # not cached


def test_available_memory_reads_this_host():
    free = auto_workers.available_memory()
    assert free is None or free > 0


def test_cli_and_config_resolve_auto_to_a_number(tiny_model_dir, tmp_path):
    import cli_runner

    (tmp_path / ".git").mkdir()
    argv = ["probe", "--model", str(tiny_model_dir), "--dtype", "float32", "-b", "1,2", "-n", "3",
            "--workers", "auto", "--threads", "1", "--out", "run", "--prompt", "One two three"]
    r = cli_runner.run(argv, cwd=tmp_path, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    recorded = json.loads((tmp_path / "run" / "fingerprint.json").read_text()).get("workers", 1)  # written when > 1
    same = ProbeConfig(prompt="One two three", model=ModelSpec(str(tiny_model_dir), "float32"), batch_sizes=(1, 2),
                       max_new_tokens=3, threads=1)
    assert recorded == auto_workers.auto_count(same)  # this host's answer (2 on a 2-core runner), resolved by the CLI
    gate = ["gate", "--model", str(tiny_model_dir), "--dtype", "float32", "-b", "1,2", "-n", "3", "--no-bisect",
            "--workers", "auto", "--threads", "1", "--out", "gate-run", "--prompt", "One two three"]
    r = cli_runner.run(gate, cwd=tmp_path, timeout=120)  # the gate checks its configs before any model loads
    assert r.returncode in (0, 1) and "internal error" not in r.stderr, r.stderr
    recorded = json.loads((tmp_path / "gate-run" / "fingerprint.json").read_text()).get("workers", 1)
    assert recorded == auto_workers.auto_count(same)
    r = cli_runner.run(["probe", "--workers", "many", "--out", "never"], cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "--workers must be an integer >= 1 or auto" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr

    from nondet.gate.config import load_config, resolve

    (tmp_path / "nondet.toml").write_text('workers = "auto"\n')
    assert resolve({}, load_config(tmp_path / "nondet.toml"), tmp_path / "nondet.toml").workers == "auto"
    (tmp_path / "nondet.toml").write_text('workers = "many"\n')
    with pytest.raises(Exception, match="integer >= 1 or"):
        resolve({}, load_config(tmp_path / "nondet.toml"), tmp_path / "nondet.toml")


def test_the_library_takes_auto_too(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nondet.probes.inmemory import probe_model
    from nondet.probes.probe import run_probe

    config = ProbeConfig(prompt="One two three", model=ModelSpec(str(tiny_model_dir), "float32"), batch_sizes=(1, 2),
                         max_new_tokens=3, threads=1, workers="auto", out=str(tmp_path / "run"))
    result = run_probe(config)
    recorded = json.loads((result.run_dir / "fingerprint.json").read_text()).get("workers", 1)  # written when > 1
    assert recorded == auto_workers.auto_count(config)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32")
    in_memory = probe_model(model, AutoTokenizer.from_pretrained(tiny_model_dir), config)  # auto is 1 here
    assert in_memory.streams
