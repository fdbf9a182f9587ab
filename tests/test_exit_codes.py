"""Common new-user mistakes: each gives its exit code and its exact one-line message.

stderr is compared whole (never stripped): an error on a non-terminal stderr is one line, with no
blank line before it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from stub_server import StubServer  # noqa: E402
import cli_runner


def nondet(*args, env=None, cwd=None):
    return cli_runner.run(args, env={**os.environ, **(env or {})}, cwd=cwd, timeout=300)


# -- errors on a non-terminal stderr ------------------------------------------------------


def test_error_on_a_pipe_is_one_line_without_a_blank_line_before_it(tmp_path):
    missing = tmp_path / "no-such-model"
    r = nondet("probe", "--model", str(missing))  # no --json: the progress bar path
    assert r.returncode == 3
    assert r.stderr == f"nondet: error: model directory not found: {missing}\n"


def test_debug_traceback_shows_the_frame_hidden_under_from_none(tmp_path):
    missing = tmp_path / "prompt.txt"
    r = nondet("probe", "--prompt-file", str(missing), env={"NONDET_DEBUG": "1"})
    assert r.returncode != 0
    assert "FileNotFoundError" in r.stderr and "UsageError: cannot read prompt file" in r.stderr


# -- devices ------------------------------------------------------------------------------


def test_unknown_device_is_a_usage_error(tmp_path):
    r = nondet("probe", "--device", "tpu:7", "--out", str(tmp_path / "r"))
    assert r.returncode == 2
    assert r.stderr == "nondet: error: --device 'tpu:7' is not a torch device; use cpu, cuda or cuda:N\n"


def test_cuda_on_a_torch_without_cuda_is_a_usage_error(tmp_path):
    import torch

    if torch.backends.cuda.is_built():
        pytest.skip("this torch is built with CUDA")
    r = nondet("probe", "--device", "cuda:0", "--out", str(tmp_path / "r"))
    assert r.returncode == 2
    assert r.stderr == (f"nondet: error: --device 'cuda:0': this torch ({torch.__version__}) was built without "
                        "CUDA; use --device cpu\n")


# -- out of memory on CPU -----------------------------------------------------------------

# torch's CPU allocator raises a plain RuntimeError; generate fails like this from batch size 4 on.
_OOM = ("import sys\n"
        "from transformers.generation.utils import GenerationMixin\n"
        "real = GenerationMixin.generate\n"
        "def generate(self, *args, **kwargs):\n"
        "    if kwargs['input_ids'].shape[0] >= 4:\n"
        "        raise RuntimeError('[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can\\'t '\n"
        "                           'allocate memory: you tried to allocate 2097152000 bytes. Error code 12')\n"
        "    return real(self, *args, **kwargs)\n"
        "GenerationMixin.generate = generate\n"
        "sys.argv = ['nondet', *sys.argv[1:]]\n"
        "from nondet.cli.app import main\n"
        "main()\n")


def test_cpu_out_of_memory_exits_3_naming_the_batch_size_and_keeps_the_streams(tmp_path, tiny_model_dir):
    out = tmp_path / "r"
    r = subprocess.run([sys.executable, "-c", _OOM, "probe", "--model", str(tiny_model_dir), "-b", "1,2,4",
                        "-p", "Tell me about Richard Feynman", "-n", "3", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 3
    assert r.stderr == ("nondet: error: out of memory at batch size 4 on cpu; lower --batch-sizes or "
                        f"--max-new-tokens; streams already written stay in {out}\n")
    streams = [json.loads(line) for line in (out / "streams.jsonl").read_text().splitlines()]
    assert [s["condition_id"].rsplit("/", 2)[-2:] for s in streams] == [["bs1", "ref"], ["bs2", "ends"], ["bs2", "ends"]]


def test_out_of_memory_anywhere_else_is_exit_3_not_a_bug(tmp_path):
    code = ("import sys\n"
            "import nondet.probes.probe as p\n"
            "def boom(*a, **k):\n"
            "    raise RuntimeError(\"DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes\")\n"
            "p.run_probe = boom\n"
            "sys.argv = ['nondet', 'probe', '--json']\n"
            "from nondet.cli.app import main\n"
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 3
    assert r.stderr == ("nondet: error: out of memory (RuntimeError: DefaultCPUAllocator: can't allocate memory: "
                        "you tried to allocate 8 bytes); results already written stay in the run directory\n")


# -- a live server --------------------------------------------------------------------------


def test_server_closing_mid_body_is_a_truncated_response_exit_5(tmp_path):
    out = tmp_path / "r"
    with StubServer(mode="truncated") as stub:
        r = nondet("probe", "--endpoint", stub.url, "--runs", "2", "--out", str(out), "--json")
    assert r.returncode == 5
    assert r.stderr == (f"nondet: error: {stub.url}/v1/completions sent a truncated response (26 of 500 bytes, "
                        f"then closed the connection; 3 attempts); 0 completed answers are kept in {out}: "
                        f"finish with `nondet probe --resume {out}`\n")


def test_server_without_logprobs_has_no_numeric_divergence(tmp_path):
    out = tmp_path / "r"
    with StubServer(mode="nologprobs") as stub:
        r = nondet("probe", "--endpoint", stub.url, "--runs", "2", "-n", "4", "--out", str(out),
                   env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("n/a (server returned no logprobs)") == 2  # the table: one per condition
    m = json.loads((out / "summary.json").read_text())["modes"]["default"]
    assert m["numeric_na"] == "server returned no logprobs"
    assert m["first_numeric_divergence"] is None
    assert {c["first_numeric_divergence"] for c in m["conditions"] + m["runs"]} == {None}
    report = (out / "report.md").read_text()
    assert ("| `default/server/burst` | default | server | 2 |  | poisson | 2 | 0 | 1 | — "
            "| n/a (server returned no logprobs) |") in report
    assert "bit-identical" not in report.split("## Conditions")[0]  # the verdict claims nothing about bits
    assert "one batched generate call" not in report
    assert ("Server probe: the reference is one request sent alone, nothing else in flight; the burst is 2 "
            "concurrent copies of it, at most 2 in flight") in report


def test_resume_is_recorded_and_reported(tmp_path):
    out = tmp_path / "r"
    with StubServer(drop_after=2) as stub:
        first = nondet("probe", "--endpoint", stub.url, "--runs", "4", "--concurrency", "1",
                       "--filler-requests", "0", "-n", "4", "--out", str(out), "--json")
        assert first.returncode == 3
        stub.drop_after = None
        r = nondet("probe", "--resume", str(out), "--json")
    assert r.returncode == 0, r.stderr
    config = json.loads((out / "config.json").read_text())
    [resume] = config["resumes"]
    assert resume["runs_added"] == 3 and resume["endpoint"] == stub.url
    assert resume["time"].endswith("Z")
    report = (out / "report.md").read_text()
    assert (f"Resumed 1 time(s) with --resume ({resume['time']}: 3 run(s) added): the runs added then ran after "
            "the interruption, possibly on a restarted server with another batch around them.") in report


# -- the gate's GitHub step summary ----------------------------------------------------------


@pytest.mark.parametrize("where", ["a directory", "a missing parent"])
def test_unwritable_step_summary_is_a_warning_not_a_failed_gate(tmp_path, tiny_model_dir, where):
    (tmp_path / ".git").mkdir()  # a repository root: no config file above it is read
    target = tmp_path / "summary-dir" if where == "a directory" else tmp_path / "missing" / "summary.md"
    if where == "a directory":
        target.mkdir()
    reason = "Is a directory" if where == "a directory" else "No such file or directory"
    r = nondet("gate", "--model", str(tiny_model_dir), "-b", "1,2", "-n", "3", "--kernels", "batch-invariant",
               "--junit", "junit.xml", "--out", "run", cwd=tmp_path,
               env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(target)})
    assert r.returncode == 0, r.stderr
    assert r.stderr == (f"nondet: warning: cannot write the GitHub step summary to {target}: {reason}; "
                        "the gate's verdict stands\n")
    assert (tmp_path / "junit.xml").is_file()
    assert any(line.startswith("::notice title=nondet gate::policy met") for line in r.stdout.splitlines())


def test_gate_bisect_line_explains_both_numbers():
    from nondet.gate.diagnose import bisect_line

    first = {"step": 1, "module": "model.layers.0.mlp.down_proj", "op_class": "matmul"}
    lasting = {"step": 4, "module": "model.layers.1.mlp.down_proj", "op_class": "matmul"}
    assert bisect_line({"origin": first, "lasting": lasting, "minimal_set": ["matmul"]}, logprob_step=4) == (
        "first differing activation bits at step 1 in model.layers.0.mlp.down_proj (matmul), transient; lasting "
        "divergence from step 4 in model.layers.1.mlp.down_proj (matmul); the sampled token's logprob bits first "
        "differ at step 4 (the table's first numeric divergence), where the lasting divergence begins; "
        "batch-invariant matmul removes it")
    assert bisect_line({"origin": first}, logprob_step=35) == (
        "first differing activation bits at step 1 in model.layers.0.mlp.down_proj (matmul); the sampled token's "
        "logprob bits first differ at step 35 (the table's first numeric divergence), which no earlier activation "
        "difference had reached")
    assert bisect_line({"origin": first, "lasting": first}, logprob_step=1) == (
        "first differing activation bits at step 1 in model.layers.0.mlp.down_proj (matmul)")


def test_a_model_whose_tokenizer_has_no_vocabulary_is_one_usage_line(tmp_path):
    # a model saved without its tokenizer files: transformers still builds the model type's tokenizer,
    # empty, and the prompt becomes no tokens (generate used to crash in the embedding: "internal error")
    from family_models import save_family

    model = save_family("qwen3", tmp_path / "no-vocab")
    result = nondet("probe", "--model", model, "--batch-sizes", "1", "-n", "2", "--out", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "nondet: error: the prompt 'Tell me about Richard Feynman' tokenizes to no tokens; give a non-empty "
        "prompt, or check that the model directory holds its tokenizer's vocabulary (tokenizer.json)")


# -- a run directory is written by one run --------------------------------------------------


def test_a_second_probe_into_a_used_run_dir_is_refused_and_the_first_kept(tmp_path, tiny_model_dir):
    out = tmp_path / "r"
    first = nondet("probe", "--model", str(tiny_model_dir), "-p", "Hi", "-n", "2", "--batch-sizes", "1,2",
                   "--out", str(out), "--json")
    assert first.returncode == 0, first.stderr
    streams = (out / "streams.jsonl").read_bytes()
    again = nondet("probe", "--model", str(tiny_model_dir), "-p", "Hi", "-n", "2", "--out", str(out), "--json")
    assert again.returncode == 2
    assert again.stderr == f"nondet: error: {out} already holds a run; pass a new --out, or remove it\n"
    assert (out / "streams.jsonl").read_bytes() == streams


def test_a_server_probe_into_a_used_run_dir_points_at_resume(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "streams.jsonl").write_text("")
    r = nondet("probe", "--endpoint", "http://127.0.0.1:9", "--out", str(out))
    assert r.returncode == 2
    assert r.stderr == f"nondet: error: {out} already holds a run; finish it with --resume {out} or pass a new --out\n"


def test_rl_into_a_used_run_dir_is_refused(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "streams.jsonl").write_text("")
    r = nondet("rl", "--out", str(out))
    assert r.returncode == 2
    assert r.stderr == f"nondet: error: {out} already holds a run; pass a new --out, or remove it\n"


def test_default_run_dirs_of_the_same_second_differ(tmp_path, monkeypatch):
    from nondet.probes import probe

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(probe.time, "strftime", lambda fmt: "20261126-030000")
    first = probe.default_run_dir("probe")
    Path(first).mkdir(parents=True)
    second = probe.default_run_dir("probe")
    assert first == "nondet-runs/20261126-030000-probe" and second == "nondet-runs/20261126-030000-probe-2"
