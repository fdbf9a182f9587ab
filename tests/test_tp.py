"""`nondet probe --tp` on the CPU (gloo, 2 processes, transformers' tp_plan="auto").

One `--tp 1,2 --confirm --inject-variance` run carries the acceptance: one run directory from
two worker groups, the report's TP1-vs-TP2 comparison, a positive control that fires on any
host (the injected batch-variant norm: bits differ at every degree under default kernels) and
the negative control (the mode at TP2: one completion, the same bits at every batch size).
Bad input: heads that do not divide, a rank that dies (injected with NONDET_TP_FAIL_RANK):
one line, exit 2 / 3, and no process of the run left behind.
"""

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from nondet.errors import UsageError
from nondet.probes.tp.degrees import check_devices, check_heads, parse_tp
import cli_runner


def nondet(*args, env=None):
    return cli_runner.run(args, env={**os.environ, **(env or {})}, timeout=300)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tp_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("tp") / "run"
    r = nondet("probe", "--tp", "1,2", "--model", str(tiny_model_dir), "--prompt", "Tell me about Richard Feynman",
               "--batch-sizes", "1,2,5", "--max-new-tokens", "6", "--confirm", "--inject-variance",
               "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


# -- the run directory ----------------------------------------------------------------------


def test_one_run_directory_holds_both_degrees_and_one_reference_per_mode(tp_run):
    out, _ = tp_run
    conditions = jsonl(out / "conditions.jsonl")
    assert {(c["kernels"], c["tp"]) for c in conditions} == {(k, d) for k in ("default", "batch-invariant")
                                                           for d in (1, 2)}
    assert "default/tp2/bs5/ends" in {c["condition_id"] for c in conditions}
    streams = jsonl(out / "streams.jsonl")
    refs = [(s["kernels"], s["tp"]) for s in streams if s["is_reference"]]
    assert sorted(refs) == [("batch-invariant", 1), ("default", 1)]  # TP1 alone at batch 1 is the reference
    assert len({s["run_id"] for s in streams}) == len(streams)


def test_positive_control_fires_at_every_degree(tp_run):
    _, summary = tp_run
    by_degree = summary["tensor_parallel"]["modes"]["default"]["by_degree"]
    assert [r["tp"] for r in by_degree] == [1, 2]
    # the injected norm takes another path when rows share the call: bits differ at the first decode step
    # at the latest (this host's own kernels may differ earlier, in the prefill)
    assert all(r["first_numeric_divergence"] in (0, 1) for r in by_degree), by_degree
    # the sentence names the variance at each degree (tp_verdict), not only against TP1's reference
    default_clause = summary["verdict"].split("; batch-invariant kernels:")[0]
    assert default_clause.startswith("default kernels at TP1: ") and "; at TP2: " in default_clause, summary["verdict"]
    assert "batch-invariant at every TP degree" not in default_clause, summary["verdict"]


def test_negative_control_the_mode_at_tp2_is_one_completion_with_the_same_bits(tp_run):
    out, summary = tp_run
    tp2 = next(r for r in summary["tensor_parallel"]["modes"]["batch-invariant"]["by_degree"] if r["tp"] == 2)
    assert tp2["n_runs"] == 5 and tp2["distinct_completions"] == 1 and tp2["first_numeric_divergence"] is None
    assert "batch-invariant kernels: batch-invariant at every TP degree (TP1, TP2:" in summary["verdict"]
    groups = json.loads((out / "fingerprint.json").read_text())["tensor_parallel"]["groups"]
    tp2_group = next(g for g in groups if g["degree"] == 2)
    assert tp2_group["backend"] == "gloo" and tp2_group["invariant_all_reduce_calls"] > 0  # the mode's collective ran
    # on CPU ranks no symmetric memory: the all-gather route, and no one-shot tried (kernels/symmetric_sum.py)
    assert tp2_group["invariant_all_reduce_route"].startswith("all_gather") and "symmetric_sum_refused" not in tp2_group
    # each degree's ranks took the op census on their shards; rank 0's first entry is the run's
    assert [g["census_coverage"] for g in groups] == ["invariant", "invariant"]
    fingerprint = json.loads((out / "fingerprint.json").read_text())
    assert fingerprint["census"]["coverage"] == "invariant" and fingerprint["census"]["uncovered"] == []
    assert json.loads((out / "summary.json").read_text())["kernel_coverage"]["coverage"] == "invariant"


def test_fingerprint_records_the_collective_and_nccl_settings(tp_run):
    out, _ = tp_run
    section = json.loads((out / "fingerprint.json").read_text())["tensor_parallel"]
    assert section["degrees"] == [1, 2] and section["reference_degree"] == 1
    assert section["collective"]["batch-invariant"].startswith("all_gather + sum in rank order")
    assert {"nccl_algo", "nccl_proto", "nccl_version"} <= set(section)
    assert [g["degree"] for g in section["groups"]] == [1, 2]
    # TP2's linears decode on plain local shards (probes/tp/local_params.py); TP1 has no DTensor to swap
    assert [g["local_shard_params"] > 0 for g in section["groups"]] == [False, True]


def test_report_shows_tp1_vs_tp2_and_the_run_directory_stays_readable(tp_run):
    out, summary = tp_run
    versus = summary["tensor_parallel"]["modes"]["default"]["vs_reference"]
    assert [(r["tp"], r["against"]) for r in versus] == [(2, 1)]
    report = (out / "report.md").read_text()
    assert "## Tensor parallelism" in report and "| default | TP2 | TP1 |" in report
    r = nondet("report", str(out))  # the existing report reads it again
    assert r.returncode == 0, r.stderr
    from nondet.reports.tables import read_tables

    assert len(read_tables(out).runs) == sum(m["n_runs"] for m in summary["modes"].values())


@pytest.mark.slow  # a bisect at TP2: a process group per replay
def test_bisect_cli_replays_a_tensor_parallel_run_at_its_degree(tp_run, tmp_path):
    """`nondet bisect` on a --tp run goes to the worker-group bisect (a TP2 condition replayed in one
    process would blame the wrong thing). Where the bits are born depends on this host's kernels too,
    so this checks the dispatch and the outputs; the test below checks the origin with a baseline."""
    import shutil

    run = shutil.copytree(tp_run[0], tmp_path / "cli-run")
    r = nondet("bisect", str(run), "--no-ablation")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "default/tp2/" in r.stdout and "first difference: step " in r.stdout, r.stdout
    b = json.loads((run / "bisect.json").read_text())
    assert b["tp_degree"] == 2
    # the replayed prompt alone at TP2 is the probe's: tokens and logprob bits (the keys' control:
    # tests/test_bisect_reproduced.py, one bit off; a baseline's replay, below, is not the probe's)
    assert b["reference_reproduced"] is True and b["reference_bits_reproduced"] is True
    assert b["replay"] == {"kv_cache": "dynamic", "cache_tokens": None, "probe_compiled": False}
    assert "logprob bits" not in r.stdout


@pytest.mark.slow  # a TP2 probe and its bisect
def test_a_static_cache_run_decodes_on_it_at_tp2_and_bisect_replays_its_bits(tiny_model_dir, tmp_path):
    """--tp with --kv-cache static decodes on the static cache (the ranks once took the dynamic one while
    config.json said static, and bisect's static replay then missed the probe's bits on this host)."""
    run = tmp_path / "run"
    r = nondet("probe", "--tp", "2", "--model", str(tiny_model_dir), "--prompt", "Tell me about Richard Feynman",
               "--batch-sizes", "1,2", "--max-new-tokens", "6", "--kv-cache", "static", "--inject-variance",
               "--out", str(run))
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((run / "fingerprint.json").read_text())["decode_path"] == "eager, static KV cache"
    r = nondet("bisect", str(run), "--no-ablation")
    assert r.returncode == 0, r.stdout + r.stderr
    b = json.loads((run / "bisect.json").read_text())
    assert b["replay"] == {"kv_cache": "static", "cache_tokens": 6, "probe_compiled": False}
    assert b["reference_reproduced"] is True and b["reference_bits_reproduced"] is True, r.stdout


@pytest.mark.slow  # a bisect at TP2: a process group per replay
def test_tp_bisect_names_the_injected_norm_at_tp2_and_its_ablation(tp_run, tmp_path):
    """The library's TP bisect: the lockstep on 2 ranks against the prompt alone at TP2. The baseline
    keeps this host's own matmul / attention / softmax invariant, so only the injected norm can differ."""
    import shutil

    from nondet.probes.bisect.bisect import BisectConfig
    from nondet.probes.tp.bisect import is_tensor_parallel, run_tp_bisect

    run = shutil.copytree(tp_run[0], tmp_path / "run")
    assert is_tensor_parallel(str(run))
    b = run_tp_bisect(BisectConfig(run_dir=str(run), baseline=("matmul", "attention", "softmax"))).bisect
    assert b["tp_degree"] == 2 and b["condition_id"].startswith("default/tp2/")
    assert (b["origin"]["module"], b["origin"]["op_class"], b["origin"]["step"]) == (
        "model.layers.1.post_attention_layernorm", "norm", 1)
    assert b["minimal_set"] == ["norm"]
    collective = next(e for e in b["ablation"] if e["ops"] == ["collective"])
    assert not collective["activations_match"]  # the all-reduce alone does not remove the injected norm
    assert json.loads((run / "bisect.json").read_text())["tp_degree"] == 2


# -- bad input ------------------------------------------------------------------------------


def _leftovers(marker: str) -> list[int]:
    """Live processes whose environment holds the marker (the run's ranks inherit it)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _without_leftovers(marker: str, seconds: float = 10) -> list[int]:
    deadline = time.monotonic() + seconds
    while _leftovers(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _leftovers(marker)


def test_a_rank_that_dies_is_one_line_exit_3_and_leaves_no_process(tiny_model_dir, tmp_path):
    marker = f"NONDET_TP_TEST_MARKER={uuid.uuid4().hex}"
    r = nondet("probe", "--tp", "2", "--model", str(tiny_model_dir), "--prompt", "hello there",
               "--batch-sizes", "1,2", "--max-new-tokens", "3", "--out", str(tmp_path / "run"),
               env={"NONDET_TP_FAIL_RANK": "1", marker.split("=")[0]: marker.split("=")[1]})
    assert r.returncode == 3, r.stderr
    assert r.stderr == "nondet: error: tensor-parallel worker rank 1 of 2 died (exit code 17); all ranks were stopped\n"
    assert _without_leftovers(marker) == []


def test_heads_that_do_not_divide_are_a_usage_error(tiny_model_dir, tmp_path):
    r = nondet("probe", "--tp", "1,3", "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"))
    assert r.returncode == 2
    assert r.stderr == ("nondet: error: --tp 3: the model has 4 attention heads and 2 key/value heads, which do not "
                        "divide by 3; pick a degree that divides both\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text,message", [("0", "must be an integer >= 1"), ("two", "'two' is not an integer")])
def test_bad_tp_values_are_usage_errors(text, message):
    with pytest.raises(UsageError, match=message):
        parse_tp(text)


def test_tp_degrees_parse_sorted_and_unique():
    assert parse_tp("2,1,2") == (1, 2) and parse_tp("4") == (4,)


def test_more_ranks_than_visible_gpus_is_a_usage_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UsageError, match=r"--tp 2 needs 2 GPUs, but 1 are visible"):
        check_devices("cuda", (1, 2))
    check_devices("cuda", (1,))
    check_devices("cpu", (8,))  # CPU ranks are processes: any degree


def test_check_heads_counts_kv_heads_too():
    from types import SimpleNamespace

    check_heads(SimpleNamespace(num_attention_heads=8, num_key_value_heads=4), (1, 2, 4))
    with pytest.raises(UsageError, match="--tp 8: the model has 8 attention heads and 4 key/value heads"):
        check_heads(SimpleNamespace(num_attention_heads=8, num_key_value_heads=4), (8,))


def test_tp_with_another_load_is_a_usage_error(tmp_path):
    r = nondet("probe", "--tp", "2", "--load", "continuous", "--out", str(tmp_path / "run"))
    assert r.returncode == 2
    assert r.stderr.startswith("nondet: error: --tp runs static batches in worker processes")


@pytest.mark.slow  # a TP2 group started, then its parent killed and the ranks waited for
def test_a_killed_parent_leaves_no_rank_behind(tiny_model_dir, tmp_path):
    """SIGTERM skips Python's cleanup: the ranks' watchdog must notice their parent is gone."""
    import signal

    key, value = "NONDET_TP_TEST_MARKER", uuid.uuid4().hex
    marker = f"{key}={value}"
    parent = subprocess.Popen([sys.executable, "-m", "nondet", "probe", "--tp", "2", "--model", str(tiny_model_dir),
                               "--prompt", "hello there", "--batch-sizes", "1-8", "--max-new-tokens", "3000",
                               "--out", str(tmp_path / "run")], env={**os.environ, key: value},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (tmp_path / "run" / "config.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # the ranks are loaded and generating (rank 0 said "ready")
    assert len(_leftovers(marker)) >= 3  # the parent and both ranks (and multiprocessing's resource tracker)
    parent.send_signal(signal.SIGTERM)
    parent.wait(30)
    assert _without_leftovers(marker, seconds=5) == []  # the watchdog polls every second
