"""NONDET_CUDA_GRAPHS=0: the compiled path on CUDA without CUDA graphs, said in its label and its saved steps' options."""

from nondet.probes.core import compiled
from nondet.probes.core.aot_step import compile_options


def _graphs(config) -> bool:
    return bool(compile_options(config)["options"].get("triton.cudagraphs"))


def test_cuda_captures_graphs_unless_switched_off_and_the_label_and_options_say_which(monkeypatch):
    on = compiled.generation_fields("inductor", "cuda")["compile_config"]
    assert _graphs(on) and "CUDA graphs" in compiled.label("inductor", "cuda")
    monkeypatch.setenv(compiled.CUDA_GRAPHS_ENV, "0")
    off = compiled.generation_fields("inductor", "cuda")["compile_config"]
    assert off.mode == "default" and not _graphs(off)
    assert compiled.label("inductor", "cuda") == "torch.compile (inductor), static KV cache"
    filtered = compiled.generation_fields("inductor", "cuda", guard_filter=lambda entries: [])["compile_config"]
    assert "triton.cudagraphs" not in filtered.options  # the TP ranks' options too
    assert on.to_dict()["mode"] != off.to_dict()["mode"]  # step_key reads the config's fields: two files


def test_a_cpu_never_captures_graphs_whatever_the_switch(monkeypatch):
    for value in ("1", "0"):
        monkeypatch.setenv(compiled.CUDA_GRAPHS_ENV, value)
        config = compiled.generation_fields("inductor", "cpu")["compile_config"]
        assert config.mode == "default" and not _graphs(config)
        assert compiled.label("inductor", "cpu") == "torch.compile (inductor), static KV cache"
