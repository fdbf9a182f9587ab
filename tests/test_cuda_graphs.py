"""`--cuda-graphs` on a machine without CUDA: what decides when a recorded graph may replay (one signature per
batch shape and kernels, the same from step to step and from call to call on the held cache), the refusals, and
how the summary and the report name the path. The graphs themselves run in tests/gpu/test_cuda_graphs_gpu.py."""

import pytest

import cli_runner
from model_fixtures import cache_lengths
from nondet.probes.core.conditions import Condition
from nondet.probes.core.static_caches import reusable_static_cache

PROMPT = "Tell me about Richard Feynman"


@pytest.fixture
def signatures(monkeypatch, tiny_model_dir):
    """signatures(batch, kernels) -> the signature of every decode step generate hands the CUDA-graph path.
    transformers calls that path on CUDA only: here its config asks for every device, and the steps run eagerly."""
    from nondet.probes.core import captured
    from nondet.probes.core.graph_signature import signature
    from nondet.probes.core.replay import DecodeSettings, replay_condition
    from nondet.probes.models.loading import ModelSpec, load_model

    seen = []
    made = captured.generation_fields

    def on_every_device():
        fields = made()
        fields["compile_config"]._compile_all_devices = True
        return fields

    def spy(self, **inputs):
        seen.append(signature(inputs))
        return self.model(**inputs)

    monkeypatch.setattr(captured, "generation_fields", on_every_device)
    monkeypatch.setattr(captured.CapturedSteps, "__call__", spy)
    loaded = load_model(ModelSpec(name=str(tiny_model_dir)))
    tok = loaded.tokenizer
    target = tok(PROMPT, add_special_tokens=False)["input_ids"]
    filler = tok("The quick brown fox jumps", add_special_tokens=False)["input_ids"]

    def run(batch: int, kernels: str = "default") -> list:
        seen.clear()
        condition = Condition(f"t/bs{batch}", kernels, batch, (0,), "same-length" if batch > 1 else "none")
        replay_condition(loaded.model, tok, condition, target, [filler], DecodeSettings(8, 0.0, 0, cuda_graphs=True))
        return list(seen)

    return run


def test_every_decode_step_of_a_batch_shape_has_one_signature(signatures):
    one = signatures(1)
    assert len(one) >= 6 and len(set(one)) == 1  # one graph serves all the steps (a growing mask would not)
    if reusable_static_cache():  # the held cache (transformers 5.24+): the next call replays the same graphs
        assert signatures(1) == one
    three, mode = signatures(3), signatures(1, "batch-invariant")
    assert len(set(three)) == 1 and set(three).isdisjoint(one)  # another batch shape: another graph
    assert len(set(mode)) == 1 and set(mode).isdisjoint(one)  # the default kernels' graph never replays under the mode


def test_a_signature_follows_shapes_strides_and_the_caches_addresses():
    import torch

    from nondet.probes.core.graph_signature import signature

    class Layer:
        def __init__(self, keys):
            self.keys, self.length = keys, torch.zeros(())

    class Cache:
        def __init__(self, keys):
            self.layers = [Layer(keys)]

    keys = torch.zeros(2, 4, 8)
    cache = Cache(keys)
    ids = torch.tensor([[5], [7]])
    base = signature({"input_ids": ids, "past_key_values": cache, "use_cache": True})
    assert signature({"input_ids": ids + 1, "past_key_values": cache, "use_cache": True}) == base  # values: no
    assert signature({"input_ids": ids[:1], "past_key_values": cache, "use_cache": True}) != base  # shape
    wide = torch.zeros(2, 3)
    assert signature({"position_ids": wide.t().contiguous().t()}) != signature({"position_ids": wide})  # strides
    assert signature({"input_ids": ids, "past_key_values": Cache(keys.clone()), "use_cache": True}) != base
    assert signature({"input_ids": ids, "past_key_values": cache, "use_cache": False}) != base
    masks = {"full_attention": torch.zeros(2, 1, 1, 9)}
    assert signature({"input_ids": ids, "attention_mask": masks}) != signature(
        {"input_ids": ids, "attention_mask": {"full_attention": torch.zeros(2, 1, 1, 10)}})


@pytest.mark.parametrize("args, line", [
    ([], "--cuda-graphs records decode steps on a CUDA device; add --device cuda"),
    (["--compile"], "--cuda-graphs and --compile are two decode paths"),
    (["--load", "continuous"], "--cuda-graphs decodes static batches in this process"),
    (["--budget", "30"], "--cuda-graphs decodes static batches in this process"),
])
def test_cuda_graphs_refusals_are_one_line_exit_2(tmp_path, args, line):
    r = cli_runner.run(["probe", "-p", PROMPT, "--cuda-graphs", *args, "--out", str(tmp_path / "r")], timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert line in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "r").exists()


def _summary(path: str = "cuda-graphs") -> dict:
    mode = {"path": path, "reason": None if path != "eager" else "RuntimeError: capture failed", "warmup_s": 1.25,
            "measured_s": 2.5, "conditions": 4, "warm_ups": 4, "graph_breaks": 0, "graphs_traced": 0,
            "eager_steps": 4, "graphs_recorded": 4, "steps_replayed": 700}
    return {"compiled": "eager kernels replayed from CUDA graphs (one per batch shape), static KV cache",
            "backend": "cuda-graphs", "precompiled": {}, "modes": {"batch-invariant": mode}}


def test_the_cli_names_the_recorded_path_and_its_replays():
    from nondet.cli.render import decode_path_lines

    line = decode_path_lines(_summary())[0]
    assert line.startswith("batch-invariant: eager kernels replayed from CUDA graphs")
    assert "record + warm-up 1.2 s (4 batch shapes, 4 CUDA graphs recorded, 700 steps replayed)" in line
    assert "compile" not in line
    fallback = decode_path_lines(_summary("eager"))[0]
    assert "could not record: RuntimeError: capture failed" in fallback


def test_the_report_names_the_recorded_path(tmp_path):
    from types import SimpleNamespace

    from nondet.reports.content import _decode_path_note

    tables = SimpleNamespace(fingerprint={"decode_path": _summary()["compiled"]}, summary={"decode_path": _summary()})
    text = "".join(str(part) for part in _decode_path_note(tables)[0].parts)
    assert "batch-invariant kernels recorded (record + warm-up 1.2 s" in text and "compile" not in text


def test_the_routing_trace_reads_a_recorded_steps_experts_after_each_replay():
    """A replayed graph runs no hook: while a step is recorded, the trace's hook hands the whole batch's ids to
    the graph (captured.keep), and a trace takes its own target rows from them after each replay, a later call's
    trace of other target rows too. The recording is simulated on the CPU (the forward runs; the replay is the
    listeners' call). Control: a trace that is not told of the replay has no ids for that step."""
    import torch
    from family_models import _configs
    from transformers import AutoModelForCausalLM

    from nondet.probes.core import captured
    from nondet.probes.core.routing_trace import RoutingTrace

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_configs()["qwen3-moe"]()).eval()
    ids = torch.randint(3, 200, (3, 5))
    with torch.no_grad():
        with RoutingTrace(model, [0], 3) as direct:  # eager: the hook reads row 0's ids itself
            model(ids)
        with RoutingTrace(model, [2], 3) as recording:
            captured._KEEPING.append([])
            try:
                model(ids)
            finally:
                kept = captured._KEEPING.pop()
        with RoutingTrace(model, [0], 3) as replaying:  # a later call of the same shape, another target row
            for listener in list(captured._LISTENERS):
                listener(kept)
    assert len(kept) == 2 and kept[0].shape == (3, 2)  # per MoE layer, every row's top-2
    assert recording.experts() == {2: []}  # the control: nothing read while recording, no replay told
    assert replaying.experts() == direct.experts() and len(direct.experts()[0]) == 1
    assert captured._LISTENERS == []  # each trace stopped listening when it ended


def test_a_step_that_changes_host_state_is_not_recorded():
    """transformers' sliding-window cache counts its length in a Python int inside the step; a replayed graph
    would leave it behind (and keep the branch it took). The first, eager step of a signature finds it and
    refuses; the decoder then runs that kernels mode eager (DecodePaths). Control: a cache whose step changes only
    tensors passes."""
    import torch

    from nondet.probes.core.captured import HostStateStep, _eager_step

    class Layer:
        def __init__(self):
            self.length, self.counted = torch.zeros(()), 0

    class Cache:
        def __init__(self):
            self.layers, self.window = [Layer(), Layer()], 8

    def on_the_device(cache, **_):
        for layer in cache.layers:
            layer.length.add_(1)
        return "out"

    def on_the_host(cache, **_):
        cache.layers[1].counted += 1
        return on_the_device(cache)

    assert _eager_step(on_the_device, {"cache": Cache(), "use_cache": True}) == "out"
    with pytest.raises(HostStateStep, match=r"changes cache\.layers\.1\.counted \(now 1\) on the host"):
        _eager_step(on_the_host, {"cache": Cache(), "use_cache": True})


def test_the_gate_takes_cuda_graphs_from_its_config_and_refuses_it_off_cuda(tmp_path):
    """`cuda-graphs = true` in [tool.nondet] reaches the batch axis's probe, which refuses it on the CPU in one line
    before any model loads (a GPU runner's gate decodes from the graphs: tests/gpu)."""
    from nondet.gate.config import load_config, resolve

    (tmp_path / ".git").mkdir()
    (tmp_path / "nondet.toml").write_text("cuda-graphs = true\nbatch-sizes = [1, 2]\n")
    assert resolve({}, load_config(tmp_path / "nondet.toml"), tmp_path / "nondet.toml").cuda_graphs is True
    r = cli_runner.run(["gate", "-p", PROMPT, "--out", str(tmp_path / "g")], timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--cuda-graphs records decode steps on a CUDA device; add --device cuda" in r.stderr
    assert "Traceback" not in r.stderr


def test_every_static_cache_call_has_its_own_length(tiny_model_dir):
    """transformers sizes a static cache it builds to the longest an earlier call on the model asked for; a probe's
    short prompt after a long one would then decode over more masked positions than its reference did. Each call
    of the probe's gets prompt + new tokens. Control: transformers' generate alone, called the same way, does not."""
    import torch

    from nondet.probes.core.batch import Batch
    from nondet.probes.core.replay import DecodeSettings, generate
    from nondet.probes.models.loading import ModelSpec, load_model

    loaded = load_model(ModelSpec(name=str(tiny_model_dir)))

    def call(tokens: int, ours: bool) -> int:
        ids = list(range(5, 5 + tokens))
        with cache_lengths(loaded.model) as lengths:
            if ours:
                generate(loaded.model, loaded.tokenizer, Batch([ids], [[1] * tokens], (0,)),
                         DecodeSettings(4, 0.0, 0, kv_cache="static"), None)
            else:
                loaded.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, tokens, dtype=torch.long),
                                      max_new_tokens=4, do_sample=False, cache_implementation="static",
                                      disable_compile=True, pad_token_id=0)
        return lengths[-1]

    own = 0 if reusable_static_cache() else -1  # the held cache: prompt + new tokens; before 5.24 generate's, one less
    assert call(12, ours=True) == 16 + own and call(3, ours=True) == 7 + own
    assert call(12, ours=False) == 15 and call(3, ours=False) == 15  # the control: the long call's length
