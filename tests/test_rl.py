"""nondet rl on tiny models (CPU): positive and negative controls, gradients under the mode, bad input."""

import contextlib
import json

import pytest

from nondet.probes.models.loading import ModelSpec, load_model
from nondet.rl.config import SAMPLER_RULES, RLConfig, sampler_kind
from nondet.rl.run import run_rl
from nondet.rundir import RunDir
from nondet.rundir.reader import read_conditions, read_streams
import cli_runner

PROMPTS = ("Tell me about Richard Feynman", "The history of the printing press", "Hello there",
           "A much longer prompt about the weather in Paris today")


def config(model_dir, out, **kw) -> RLConfig:
    base = dict(model=ModelSpec(name=str(model_dir), inject_variance=True), prompts=PROMPTS, max_new_tokens=6,
                sampler_batch=1, micro_batches=(1, 4), kernels=("default", "batch-invariant"), out=str(out))
    kind = sampler_kind(RLConfig(**kw))  # rl/config.py refuses a sampler-side setting its sampler does not read
    base = {k: v for k, v in base.items() if all(k != path or kind in readers for _, path, readers in SAMPLER_RULES)}
    return RLConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def controls(tiny_model_dir, tmp_path_factory):
    """The positive control (one-row decode vs teacher-forced prefill through the batch-variant norm,
    default kernels) and the negative control (the mode on both sides) in one run directory."""
    return run_rl(config(tiny_model_dir, tmp_path_factory.mktemp("rl") / "run", padding="right"))


def pairs(result, kernels):
    return [p for p in result.summary["rl"]["pairs"] if p["kernels"] == kernels]


def test_positive_control_default_kernels_mismatch(controls):
    for p in pairs(controls, "default"):
        assert p["n_tokens"] == 24 and p["n_identical"] < p["n_tokens"]
        assert p["dlogp_max"] > 0 and p["kl_k3"] > 0 and p["seqs_differ"] > 0
        assert p["kl_exact"] > 0 and p["kl_exact_max"] >= p["kl_exact"]  # the full distributions differ too
    assert "default kernels: off-policy" in controls.summary["verdict"]


def test_negative_control_mode_on_both_sides_is_bit_identical(controls):
    for p in pairs(controls, "batch-invariant"):
        assert p["n_tokens"] == 24 and p["frac_identical"] == 1.0
        assert p["kl_k1"] == p["kl_k2"] == p["kl_k3"] == 0.0 and p["dlogp_max"] == 0.0
        assert p["kl_exact"] == 0.0 and p["kl_exact_max"] == 0.0  # exact KL over the whole vocabulary
        assert p["first_diff"] == [None] * 4
        assert p["backward"] is True and p["grad_finite"] is True  # loss.backward() ran under the mode
    assert "batch-invariant kernels: true on-policy" in controls.summary["verdict"]


def test_run_directory_holds_both_sides(controls):
    rd = RunDir(controls.run_dir)
    ids = [c.condition_id for c in read_conditions(rd)]
    assert "default/sampler/bs1/b0" in ids and "batch-invariant/trainer/mb4/right" in ids
    streams = read_streams(rd)
    assert len({s.run_id for s in streams}) == len(streams)
    trainer = [s for s in streams if s.extra.get("side") == "trainer"]
    assert trainer and all(st.logprob.startswith(("-0x", "0x")) for s in trainer for st in s.steps)
    assert json.loads((controls.run_dir / "config.json").read_text())["command"] == "rl"


def test_left_padding_and_batched_ragged_sampler_are_bit_identical_under_the_mode(tiny_model_dir, tmp_path):
    result = run_rl(config(tiny_model_dir, tmp_path / "run", padding="left", sampler_batch=4, micro_batches=(4,),
                           kernels=("batch-invariant",), top_k=50, top_p=0.9))
    (p,) = pairs(result, "batch-invariant")
    assert p["n_tokens"] > 0 and p["frac_identical"] == 1.0 and p["kl_k3"] == 0.0


def test_rollouts_run_the_trainer_side_only(tiny_model_dir, controls, tmp_path):
    sampled = [s for s in read_streams(RunDir(controls.run_dir))
               if s.extra.get("side") == "sampler" and s.kernels == "batch-invariant"]
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": s.extra["prompt_ids"], "completion_ids": [st.token for st in s.steps],
                                        "logprobs": [st.logprob for st in s.steps]}) + "\n" for s in sampled))
    result = run_rl(config(tiny_model_dir, tmp_path / "run", prompts=(), rollouts=str(path), micro_batches=(4,),
                           kernels=("batch-invariant",)))
    (p,) = pairs(result, "batch-invariant")
    assert p["sampler"] == "external" and p["n_tokens"] == 24 and p["frac_identical"] == 1.0
    assert p["kl_exact"] is None  # the exported sampler's distributions are not at hand


def test_exact_kl_is_stored_per_trainer_token(controls):
    trainer = [s for s in read_streams(RunDir(controls.run_dir)) if s.extra.get("side") == "trainer"]
    assert trainer and all(len(s.extra["kl"]) == len(s.steps) for s in trainer)
    mode = [float.fromhex(k) for s in trainer if s.kernels == "batch-invariant" for k in s.extra["kl"]]
    default = [float.fromhex(k) for s in trainer if s.kernels == "default" for k in s.extra["kl"]]
    assert set(mode) == {0.0} and max(default) > 0


def test_packed_micro_batches_positive_and_negative_control(tiny_model_dir, tmp_path):
    """One packed row per micro-batch of 4 (positions restart, attention within each sequence): the mode gives
    the sampler's bits exactly (attention leaking across sequences could not); the injected norm does not."""
    result = run_rl(config(tiny_model_dir, tmp_path / "run", padding="packed", micro_batches=(4,)))
    (mode,) = pairs(result, "batch-invariant")
    assert mode["padding"] == "packed" and mode["n_tokens"] == 24 and mode["frac_identical"] == 1.0
    assert mode["kl_exact"] == 0.0 and mode["kl_k3"] == 0.0
    (default,) = pairs(result, "default")
    assert default["n_identical"] < default["n_tokens"] and default["kl_exact"] > 0


def test_packed_layout_restarts_positions():
    from nondet.probes.rl.packed import packed

    ids, positions, places = packed([(1, 2, 3), (4, 5), (6,)])
    assert ids == [[1, 2, 3, 4, 5, 6]] and positions == [[0, 1, 2, 0, 1, 0]] and places == [(0, 0), (0, 3), (0, 5)]


def test_exact_kl_by_hand():
    import math

    import torch

    from nondet.probes.rl.kl import exact_kl

    s = torch.log(torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]))  # -inf where truncated
    t = torch.log(torch.tensor([[0.25, 0.25, 0.5], [0.5, 0.5, 0.0]]))
    kl = exact_kl(s, t)
    assert kl.tolist() == pytest.approx([math.log(2), math.log(2)])
    assert exact_kl(s, s).tolist() == [0.0, 0.0]  # identical bits: exactly 0, -inf entries add nothing
    assert exact_kl(t, s)[0] == math.inf  # mass the other side truncated away


GRAD_RTOL = 1e-4  # fp32 model: relative L2 distance of all gradients, mode vs default (measured 2.6e-7 on CPU)


def test_backward_under_the_mode_gives_finite_gradients_close_to_default(tiny_model_dir):
    import torch

    from nondet.kernels import batch_invariant
    from nondet.probes.rl.trainer import Sequence, padded, target_index, training

    loaded = load_model(ModelSpec(name=str(tiny_model_dir), dtype="float32"))
    model = loaded.model
    chunk = [Sequence(0, (5, 9, 13, 21), (40, 41, 42)), Sequence(1, (7, 8), (50, 51, 52, 53))]
    ids, mask, offsets = padded([s.prompt + s.completion for s in chunk], "right", 0)
    rows, cols, tokens = target_index(chunk, list(enumerate(offsets)))

    def grads(mode):
        model.zero_grad(set_to_none=True)
        with training(model), mode:
            mask_t = torch.tensor(mask)
            logits = model(input_ids=torch.tensor(ids), attention_mask=mask_t,
                           position_ids=(mask_t.cumsum(-1) - 1).clamp(min=0), use_cache=False).logits
            lp = torch.log_softmax(logits[rows, cols].float(), -1).gather(-1, torch.tensor(tokens)[:, None])
            (-lp.mean()).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    ref = grads(contextlib.nullcontext())
    got = grads(batch_invariant(model=model))
    assert torch.isfinite(got).all() and got.numel() == ref.numel()
    assert torch.linalg.vector_norm(got - ref) <= GRAD_RTOL * torch.linalg.vector_norm(ref)


# -- bad input: one line, exit 2 (usage), nothing run ------------------------------------------------


def nondet(*args):
    proc = cli_runner.run(args, timeout=300)
    return proc.returncode, proc.stderr.strip()


def test_temperature_zero_is_a_usage_error():
    code, err = nondet("rl", "--temperature", "0")
    assert code == 2
    assert err == ("nondet: error: --temperature 0 is greedy: there is no sampling distribution whose logprobs "
                   "sampler and trainer could compare; pass --temperature > 0 (RL samples at 1)")


def test_rollouts_with_mismatched_lengths(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"prompt_ids": [1, 2], "completion_ids": [3, 4, 5], "logprobs": [-0.1, -0.2]}) + "\n")
    code, err = nondet("rl", "--rollouts", str(path), "--out", str(tmp_path / "run"))
    assert code == 2
    assert err == f"nondet: error: rollouts {path} line 1: 3 completion ids but 2 logprobs"
    assert not (tmp_path / "run").exists()


def test_rollouts_with_tokens_out_of_vocabulary(tiny_model_dir, tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"prompt_ids": [1, 2], "completion_ids": [3, 99999], "logprobs": [-0.1, -0.2]}) + "\n")
    code, err = nondet("rl", "--model", str(tiny_model_dir), "--rollouts", str(path), "--out", str(tmp_path / "run"))
    assert code == 2
    assert err.startswith(f"nondet: error: rollouts {path} rollout 1: completion token 99999 is out of the "
                          "model's vocabulary (")
    assert "\n" not in err and not (tmp_path / "run").exists()


def test_report_has_the_rl_section_and_histogram(controls):
    from nondet.reports import write_report

    md, html = write_report(controls.run_dir)
    text = md.read_text()
    assert "## Sampler vs trainer" in text and "| `batch-invariant` | 4 (right) | 24 | 100.0% |" in text
    assert (controls.run_dir / "figures" / "rl_dlogp.svg").exists() and "data:image/svg+xml" in html.read_text()


def test_cli_prints_the_table(tiny_model_dir, tmp_path):
    proc = cli_runner.run(["rl", "--model", str(tiny_model_dir), "--inject-variance", "--max-new-tokens", "3", "--sampler-batch", "1", "--micro-batch", "2", "--kernels", "batch-invariant", "--out", str(tmp_path / "run")], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "sampler vs trainer logprobs" in proc.stdout and "true on-policy" in proc.stdout
    assert (tmp_path / "run" / "report.md").exists()


# -- the sampler on a live server (--endpoint) --------------------------------------------------------


class _IdsStub:
    """A tiny /v1/completions answering vLLM-style: sampled token ids ("token_id:N") and their logprobs."""

    def __enter__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from stub_server import send_json

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send({"object": "list", "data": [{"id": "stub"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                n = body["max_tokens"]
                lp = {"tokens": [f"token_id:{10 + k}" for k in range(n)], "token_logprobs": [-0.5] * n}
                self._send({"choices": [{"index": 0, "text": "", "finish_reason": "length", "logprobs": lp}]})

            def _send(self, obj):
                send_json(self, obj)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_endpoint_sampler_pairs_with_the_trainer(tiny_model_dir, tmp_path):
    with _IdsStub() as stub:
        result = run_rl(config(tiny_model_dir, tmp_path / "run", endpoint=stub.url, micro_batches=(4,),
                               kernels=("batch-invariant",)))
    (p,) = pairs(result, "batch-invariant")
    assert p["sampler"] == "external" and p["n_tokens"] == 24 and p["kl_exact"] is None
    assert p["frac_identical"] == 0.0  # the stub's logprobs are made up: the detector fires


def test_endpoint_without_logprobs_exits_5_in_one_line(tiny_model_dir, tmp_path):
    from stub_server import StubServer

    with StubServer(mode="nologprobs") as stub:
        proc = cli_runner.run(["rl", "--model", str(tiny_model_dir), "--endpoint", stub.url, "--max-new-tokens", "3", "--out", str(tmp_path / "run")], timeout=300)
    assert proc.returncode == 5
    assert proc.stderr.strip() == (f"nondet: error: the server at {stub.url} returned no logprobs: nondet rl needs "
                                   "the sampler's logprob of every sampled token (vLLM returns them; "
                                   "`transformers serve` does not)")


# -- the sampler under continuous batching (--load continuous) ------------------------------------------


def test_continuous_sampler_positive_control_one_request(tiny_model_dir, tmp_path):
    """Alone in the engine every decode step is a one-row call: the injected norm takes its one-row path,
    the trainer's prefill the split one (host-independent); the mode on both sides: bit-identical."""
    result = run_rl(config(tiny_model_dir, tmp_path / "run", prompts=PROMPTS[:1], load="continuous",
                           micro_batches=(1,)))
    (default,) = pairs(result, "default")
    assert default["n_tokens"] == 6 and default["n_identical"] < 6 and default["kl_exact"] > 0
    (mode,) = pairs(result, "batch-invariant")
    assert mode["frac_identical"] == 1.0 and mode["kl_exact"] == 0.0 and mode["kl_k3"] == 0.0


def test_continuous_sampler_batched_requests_are_bit_identical_under_the_mode(tiny_model_dir, tmp_path):
    result = run_rl(config(tiny_model_dir, tmp_path / "run", load="continuous", micro_batches=(4,),
                           kernels=("batch-invariant",)))
    (p,) = pairs(result, "batch-invariant")
    assert p["n_tokens"] == 24 and p["frac_identical"] == 1.0 and p["kl_exact"] == 0.0
    cond = [c for c in read_conditions(RunDir(result.run_dir)) if c.condition_id == "batch-invariant/sampler/continuous"]
    assert cond and cond[0].load == "rl-continuous" and cond[0].batch_size == 4


def test_backward_under_the_mode_takes_the_original_kernels(tiny_model_dir, monkeypatch):
    """Only the forward must be invariant: the gradients' matmuls go to the original kernels."""
    import torch

    from nondet.kernels import batch_invariant, ops

    model = load_model(ModelSpec(name=str(tiny_model_dir), dtype="float32")).model
    calls = []
    real_mm = ops.mm
    monkeypatch.setattr(ops, "mm", lambda *a, **k: calls.append("mm") or real_mm(*a, **k))
    with batch_invariant(model=model):
        loss = model(input_ids=torch.tensor([[5, 9, 13, 21, 40]]), use_cache=False).logits.float().logsumexp(-1).mean()
        forward_calls = len(calls)
        loss.backward()
    assert forward_calls > 0  # the forward's linears ran through the invariant matmul
    assert len(calls) == forward_calls  # the backward's did not
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
