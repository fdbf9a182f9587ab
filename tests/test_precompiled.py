"""Compiled decode steps saved by torch's AOT precompile and loaded in later processes (core/precompiled.py).

The slow test runs `probe --compile --confirm` (Inductor) three times on one NONDET_CACHE: the first
compiles and saves one function per kernels mode for every batch size, the second loads them (no
trace) and gives the same streams bit for bit; the control, NONDET_PRECOMPILE=0, is transformers'
own JIT compile: the mode's streams again, so loading changed no bit of them. The fast tests hold the key, the
compile options, the guard-refusal path and the fallback to transformers' JIT compile where torch cannot
save a step.
"""

import json
import os

import pytest

import cli_runner
from nondet.probes.core import aot_step, precompiled, step_key

PROMPT = "Tell me about Richard Feynman"
EVERY = precompiled.EVERY_BATCH  # the one batch class: a function per kernels mode serves every batch size


class _Config:
    def __init__(self, **fields):
        self.fields = fields

    def to_dict(self):
        return dict(self.fields)


def test_compile_options_ask_one_graph_and_cuda_graphs_as_an_option():
    options = aot_step.compile_options(_Config(fullgraph=False, dynamic=None, backend="inductor",
                                                  mode="reduce-overhead", options=None))
    assert options["fullgraph"] is True and "mode" not in options
    assert options["options"]["triton.cudagraphs"] is True and callable(options["options"]["guard_filter_fn"])
    plain = aot_step.compile_options(_Config(backend="inductor", mode="default", options=None))
    assert "triton.cudagraphs" not in plain["options"]
    with pytest.raises(ValueError, match="max-autotune"):
        aot_step.compile_options(_Config(backend="inductor", mode="max-autotune", options=None))


def test_the_guard_filter_leaves_out_only_what_torch_cannot_save():
    from types import SimpleNamespace

    keep = aot_step.GUARD_FILTER()
    entries = [SimpleNamespace(guard_type="TENSOR_MATCH", derived_guard_types=()),
               SimpleNamespace(guard_type="ID_MATCH", derived_guard_types=()),
               SimpleNamespace(guard_type="TYPE_MATCH", derived_guard_types=("ID_MATCH",)),
               SimpleNamespace(guard_type="EQUALS_MATCH", derived_guard_types=None)]
    assert keep(entries) == [True, False, False, True]


def test_the_key_follows_the_kernels_mode_and_the_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM, CompileConfig

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = CompileConfig(backend="inductor", mode="default")
    from nondet.kernels import batch_invariant

    default = step_key.kernels_state()
    with batch_invariant(model=model, traceable=True):
        mode = step_key.kernels_state()
    assert default != mode
    one = ("default", EVERY, default)
    keys = {step_key.step_key(model, config, slot) for slot in
            (one, ("batch-invariant", EVERY, mode), ("default", EVERY, mode))}
    assert len(keys) == 3  # the last: the mode on under the default kernels' name still keys apart
    assert step_key.step_key(model, config, one) in keys  # the same slot, the same file
    model.config.rms_norm_eps *= 2  # another model: another file
    assert step_key.step_key(model, config, one) not in keys
    assert step_key.step_key(model, CompileConfig(backend="inductor", mode="reduce-overhead"), one) not in keys


def test_the_key_follows_the_cpus_instruction_set(tiny_model_dir, monkeypatch):
    """Inductor's C++ for AVX-512 loaded under ATEN_CPU_CAPABILITY=default (or on an AVX2 host) would run code
    this process does not pick: each instruction set keys its own file."""
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM, CompileConfig

    portable = subprocess.run([sys.executable, "-c", "from nondet.probes.core.step_key import cpu_instruction_set;"
                               "print(cpu_instruction_set())"], capture_output=True, text=True, check=True,
                              env={**os.environ, "ATEN_CPU_CAPABILITY": "default"}).stdout.strip()
    here = step_key.cpu_instruction_set()
    assert portable.startswith("DEFAULT") and (here != portable or here.startswith("DEFAULT"))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    slot, config = ("default", EVERY, step_key.kernels_state()), CompileConfig(backend="inductor")
    key = step_key.step_key(model, config, slot)
    monkeypatch.setattr(step_key, "cpu_instruction_set", lambda: portable + " elsewhere")
    assert step_key.step_key(model, config, slot) != key


def _no_file(slot):
    raise FileNotFoundError(slot)


def _refuses(model, **inputs):
    raise RuntimeError("GuardManager check failed, reason: size mismatch")


def _refuses_with(guard: str):
    """A refusal as torch words it, `guard` the first of the guards it lists."""
    raise RuntimeError(f"GuardManager check failed, reason: TENSOR_MATCH verbose_code_parts={[guard + '  # x']!r}")


def test_a_batch_class_the_shared_function_refuses_gets_its_own_and_the_other_keeps_it(monkeypatch, tmp_path):
    """torch 2.11 specialises a mask's batch of 1 (SDPA broadcasting) even in the size-oblivious trace: the
    one function traced at batch 1 refused batch 2, and each refusal replaced the file the other class
    needed, so every run traced again (CPU and H200, 2026-11-28). Now the refused class gets its own slot,
    loaded or compiled (here faked), and the shared file stays for the class it serves."""
    import torch

    steps = precompiled.PrecompiledSteps(model=None, compile_config=None, folder=tmp_path)
    state = step_key.kernels_state()
    obtained = []

    def obtain(slot, inputs):
        steps.functions[slot] = lambda model, **i: f"{slot[1]} logits"
        obtained.append(slot[1])
        steps._log(slot)
        return steps.functions[slot]

    steps.functions[("default", EVERY, state)] = lambda model, **i: (_refuses(model) if len(i["input_ids"]) > 1
                                                                     else "shared logits")
    monkeypatch.setattr(steps, "_obtain", obtain)
    monkeypatch.setattr(steps, "_compile", lambda slot, inputs: pytest.fail("the shared file was traced again"))
    monkeypatch.setattr(precompiled, "_output", lambda logits, inputs: logits)
    one, two = torch.zeros(1, 1, dtype=torch.long), torch.zeros(2, 1, dtype=torch.long)
    since = precompiled.log_position()
    assert steps(input_ids=one) == "shared logits"
    assert steps(input_ids=two) == "batch 2+ logits"
    assert steps(input_ids=two) == "batch 2+ logits" and steps(input_ids=one) == "shared logits"
    assert obtained == ["batch 2+"]  # once; batch 1 stays on the shared function
    assert precompiled.report(since)["default"]["batch 2+"].startswith(
        "compiled and saved (its own function: every batch's guards refused this batch class")


def test_a_refusal_after_the_split_traces_that_slot_again(monkeypatch, tmp_path):
    """Control of the split: a slot of its own that refuses a call is traced again in place (no second split)."""
    import torch

    steps = precompiled.PrecompiledSteps(model=None, compile_config=None, folder=tmp_path)
    state = step_key.kernels_state()
    steps.split[("default", state)] = "batch 2+"
    steps.functions[("default", "batch 2+", state)] = _refuses
    calls = []
    monkeypatch.setattr(steps, "_compile", lambda slot, inputs: calls.append(slot) or (lambda model, **i: "logits"))
    monkeypatch.setattr(precompiled, "_output", lambda logits, inputs: logits)
    assert steps(input_ids=torch.zeros(2, 1, dtype=torch.long)) == "logits"
    assert calls == [("default", "batch 2+", state)]


def test_a_refusal_of_the_class_the_shared_function_was_traced_on_traces_it_again(monkeypatch, tmp_path):
    """A guard that is not the batch's (an int dynamo specialised: a window cache's token count, 2026-11-28)
    refusing the class the shared function was traced on in this process is no reason to split: split, the
    other class (here batch 2+) would reach a function traced on one step of batch 1. The shared slot is
    traced again in place. Control: a function loaded from disk (its class unknown) splits, as above."""
    import torch

    one = torch.zeros(1, 1, dtype=torch.long)
    for traced_here, split in ((True, set()), (False, {"batch 1"})):
        steps = _steps_with_files(tmp_path)
        slot = ("default", EVERY, step_key.kernels_state())
        steps.functions[slot] = _refuses
        if traced_here:
            steps.traced_on[slot] = "batch 1"
        traced = []
        monkeypatch.setattr(steps, "_compile", lambda s, inputs: traced.append(s) or (lambda model, **i: "logits"))
        monkeypatch.setattr(steps, "_load", _no_file)
        monkeypatch.setattr(precompiled, "_output", lambda logits, inputs: logits)
        assert steps(input_ids=one) == "logits"
        assert set(steps.split.values()) == split
        assert traced == [slot if traced_here else ("default", "batch 1", slot[2])]


def test_a_refused_step_whose_new_trace_fails_runs_transformers_jit_compile_and_says_why(monkeypatch, tmp_path):
    import torch

    steps = _steps_with_files(tmp_path)
    slot = ("default", "batch 2+", step_key.kernels_state())
    steps.split[("default", slot[2])] = "batch 2+"  # its own slot already: a refusal there traces it again

    def trace_fails(slot, inputs):
        raise RuntimeError("Unsupported: a graph break")

    steps.functions[slot] = _refuses
    monkeypatch.setattr(steps, "_compile", trace_fails)
    monkeypatch.setattr(precompiled, "transformers_jit", lambda model, config: lambda **inputs: "jit output")
    ids = torch.zeros(2, 1, dtype=torch.long)
    since = precompiled.log_position()
    assert steps(input_ids=ids) == "jit output"
    why = "JIT compile: RuntimeError: Unsupported: a graph break"
    assert precompiled.report(since) == {"default": {"batch 2+": why}}
    assert steps(input_ids=ids) == "jit output"  # the slot stays on the JIT compile: no second trace


def test_the_terminal_note_groups_each_batch_class_by_what_its_step_did():
    from nondet.fmt import saved_steps_note

    steps = {"batch 1": "compiled and saved (traced again: its guards refused a call: L['x'] == 8)",
             "batch 2+": "loaded", "batch 3": "JIT compile: RuntimeError: a graph break"}
    assert saved_steps_note(steps) == ("; steps loaded from NONDET_CACHE: batch 2+; steps compiled and saved: batch 1"
                                       "; steps compiled, not saved: batch 3")


def test_a_file_torch_cannot_load_is_compiled_again(monkeypatch, tmp_path):
    steps = precompiled.PrecompiledSteps(model=None, compile_config=None, folder=tmp_path)
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"not a saved function")  # e.g. written by another torch
    monkeypatch.setattr(steps, "_path", lambda slot: bad)
    monkeypatch.setattr(steps, "_compile", lambda slot, inputs: "compiled again")
    slot = ("default", EVERY, step_key.kernels_state())
    assert steps._obtain(slot, {}) == "compiled again" and slot not in steps.fallbacks


def _steps_with_files(tmp_path):
    """A PrecompiledSteps without a model: its slots' files named by hand (the key hashes a model)."""
    steps = precompiled.PrecompiledSteps(model=None, compile_config=None, folder=tmp_path)
    for mode in ("default", "batch-invariant"):
        for batch in (EVERY, precompiled.BATCH_ONE, precompiled.BATCH_MORE):
            slot = (mode, batch, step_key.kernels_state())
            steps.paths[slot] = tmp_path / f"{mode}-{batch}.bin"
    return steps


def test_a_first_call_that_fails_is_traced_again_with_the_key_length_fixed(monkeypatch, tmp_path):
    """A saved function whose first call fails (on an H200 with torch 2.11, Inductor's code for the mode's step
    with the key length symbolic: "name 'buf0' is not defined") is traced again with the length fixed and runs;
    the summary says so, and a marker beside its file makes a later process trace it so at once. Control: a
    trace with the length fixed that fails its first call too hands the slot to transformers' JIT compile."""
    import torch

    def fails(model, **inputs):
        raise NameError("name 'buf0' is not defined")

    traced = []  # whether each trace had the key length fixed
    for retraced, expected in ((lambda model, **i: "fixed-length logits", "fixed-length logits"), (fails, "jit")):
        steps = _steps_with_files(tmp_path / expected)
        slot = ("default", EVERY, step_key.kernels_state())
        steps.functions[slot] = fails
        monkeypatch.setattr(steps, "_compile", lambda s, inputs, f=retraced: traced.append(steps._lengths_fixed(s)) or f)
        monkeypatch.setattr(precompiled, "transformers_jit", lambda model, config: lambda **inputs: "jit")
        monkeypatch.setattr(precompiled, "_output", lambda logits, inputs: logits)
        since = precompiled.log_position()
        assert steps(input_ids=torch.zeros(2, 1, dtype=torch.long)) == expected
        what = precompiled.report(since)["default"][EVERY]
        if expected == "jit":
            assert what == "JIT compile: NameError: name 'buf0' is not defined"
        else:
            assert what == "compiled and saved (the key length fixed: its symbolic trace failed: NameError: name " \
                           "'buf0' is not defined)"
            marker = steps.paths[slot].with_suffix(precompiled.FIXED_LENGTHS)
            assert marker.read_text() == "NameError: name 'buf0' is not defined\n"
    assert traced == [True, True]


def test_a_symbolic_trace_that_fails_is_traced_with_the_key_length_fixed_and_a_later_process_starts_so(
        monkeypatch, tmp_path):
    """The ladder at the compile: the symbolic trace raising (torch 2.11 on an H200: "CantSplit") -> traced with
    the key length fixed, saved; a later process (a new PrecompiledSteps on the same folder, no saved file)
    traces with it fixed at once. Control: a fixed-length trace that fails too -> transformers' JIT compile."""
    import torch

    def compile_fails_when_symbolic(steps, log):
        def compile_(slot, inputs):
            log.append(steps._lengths_fixed(slot))
            if not steps._lengths_fixed(slot):
                raise RuntimeError("InductorError: CantSplit: s32 not divisible by s1*s32")
            return lambda model, **i: "logits"
        return compile_

    monkeypatch.setattr(precompiled, "_output", lambda logits, inputs: logits)
    monkeypatch.setattr(precompiled, "transformers_jit", lambda model, config: lambda **inputs: "jit")
    ids = torch.zeros(2, 1, dtype=torch.long)
    first, log = _steps_with_files(tmp_path), []
    monkeypatch.setattr(first, "_compile", compile_fails_when_symbolic(first, log))
    assert first(input_ids=ids) == "logits" and log == [False, True]
    later, log = _steps_with_files(tmp_path), []
    monkeypatch.setattr(later, "_compile", compile_fails_when_symbolic(later, log))
    assert later(input_ids=ids) == "logits" and log == [True]  # the marker: no symbolic trace failed again
    control = _steps_with_files(tmp_path / "control")

    def always_fails(slot, inputs):
        raise RuntimeError("Unsupported: a graph break")

    monkeypatch.setattr(control, "_compile", always_fails)
    since = precompiled.log_position()
    assert control(input_ids=ids) == "jit"
    assert precompiled.report(since) == {"default": {EVERY: "JIT compile: RuntimeError: Unsupported: a graph break"}}


def test_a_function_with_the_length_fixed_refused_at_another_length_runs_the_jit_compile(monkeypatch, tmp_path):
    """A function traced with the key length fixed meets a prompt of another length: its guards refuse on a
    length, not on the batch, so neither a split nor a trace per prompt length: the slot goes to transformers'
    JIT compile (whose dynamo makes the length dynamic at the second). Control: a refusal naming the batch dim
    still splits."""
    import torch

    guard = "L['inputs']['past_key_values'].layers[0].keys.size()[2] == 206"
    for refused, expected in ((guard, "jit"), ("L['inputs']['input_ids'].size()[0] == 1", "logits")):
        steps = _steps_with_files(tmp_path)
        slot = ("default", EVERY, step_key.kernels_state())
        steps.fixed_lengths[slot] = "CantSplit"
        steps.functions[slot] = lambda model, refused=refused, **i: _refuses_with(refused)
        traced = []
        monkeypatch.setattr(steps, "_compile", lambda s, inputs: traced.append(s) or (lambda model, **i: "logits"))
        monkeypatch.setattr(steps, "_load", _no_file)
        monkeypatch.setattr(precompiled, "transformers_jit", lambda model, config: lambda **inputs: "jit")
        monkeypatch.setattr(precompiled, "_output", lambda logits, inputs: logits)
        since = precompiled.log_position()
        assert steps(input_ids=torch.zeros(2, 1, dtype=torch.long)) == expected
        if expected == "jit":
            assert traced == [] and not steps.split
            assert precompiled.report(since) == {"default": {EVERY: "JIT compile: the key length fixed, a call of "
                                                             f"another length (the first guard torch lists: {guard})"}}
        else:
            assert steps.split == {("default", slot[2]): precompiled.BATCH_MORE}


def test_a_saved_function_failing_after_a_call_that_worked_raises(monkeypatch, tmp_path):
    import torch

    failing = {"now": False}

    def saved(model, **inputs):
        if failing["now"]:
            raise TypeError("CUDA graph capture failed")
        return "saved logits"

    monkeypatch.setattr(precompiled, "_output", lambda logits, inputs: logits)
    ids = torch.zeros(2, 1, dtype=torch.long)
    later = precompiled.PrecompiledSteps(model=None, compile_config=None, folder=tmp_path)
    later.functions[("default", EVERY, step_key.kernels_state())] = saved
    assert later(input_ids=ids) == "saved logits"
    failing["now"] = True
    with pytest.raises(TypeError, match="CUDA graph capture failed"):  # after a call that worked: raised
        later(input_ids=ids)


def test_a_step_torch_cannot_save_runs_transformers_jit_compile_and_says_why(tmp_path, tiny_model_dir, monkeypatch):
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe

    def unsaved(compile_config):
        raise RuntimeError("Graph breaks are not supported with aot compile")

    monkeypatch.setattr(precompiled, "compile_options", unsaved)
    monkeypatch.setenv("NONDET_CACHE", str(tmp_path / "cache"))  # nothing saved before: every step compiles
    config = ProbeConfig(prompt=PROMPT, model=ModelSpec(name=str(tiny_model_dir)), batch_sizes=(1, 2),
                         max_new_tokens=3, kernels=("default",), compile_backend="aot_eager", out=str(tmp_path / "r"))
    result = run_probe(config)
    saved = result.summary["decode_path"]["precompiled"]["default"]
    why = "JIT compile: RuntimeError: Graph breaks are not supported with aot compile"
    assert saved == {EVERY: why}
    assert result.summary["decode_path"]["modes"]["default"]["path"] == "compiled"
    assert not list((tmp_path / "cache").glob("**/*.bin"))  # nothing saved (a marker says the ladder was tried)


@pytest.mark.slow  # two Inductor compiles of a probe each (35 s a case on a 2-core AVX2 host)
@pytest.mark.parametrize("local_class", [False, True], ids=["module-class", "control-local-class"])
def test_a_model_with_the_injected_control_has_its_steps_saved(local_class, tmp_path, tiny_model_dir, monkeypatch):
    """The positive control's norm (kernels/variant.py) is a class torch can import by name, so a model
    carrying it (the demo model, always) has its compiled steps saved, not run on the JIT compile. The
    control: the same norm as a class defined in a function, as it was, which torch refuses to save."""
    from nondet.kernels import variant
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe

    if local_class:
        make = variant.make_batch_variant_norm

        def make_local(original):
            class BatchVariantRMSNorm(variant.BatchVariantRMSNorm):
                pass

            norm = make(original)
            norm.__class__ = BatchVariantRMSNorm
            return norm

        monkeypatch.setattr(variant, "make_batch_variant_norm", make_local)
    monkeypatch.setenv("NONDET_CACHE", str(tmp_path / "cache"))
    config = ProbeConfig(prompt=PROMPT, model=ModelSpec(name=str(tiny_model_dir), inject_variance=True),
                         batch_sizes=(1, 2), max_new_tokens=3, kernels=("default",), compile_backend="aot_eager",
                         out=str(tmp_path / "r"))
    saved = run_probe(config).summary["decode_path"]["precompiled"]["default"]
    if local_class:
        # torch's "Type <class '...<locals>.BatchVariantRMSNorm'> for object ... cannot be saved" (cut short)
        assert all(what.startswith("JIT compile: TypeError: Type <class") and "<locals>.BatchVariantRMSNorm" in what
                   for what in saved.values()), saved
    else:
        assert saved and all(what.startswith("compiled and saved") for what in saved.values()), saved


@pytest.mark.parametrize("family", [pytest.param("qwen3-moe", marks=pytest.mark.slow), "falcon"])
def test_a_step_saved_under_the_mode_loads_in_the_next_probe(family, tmp_path, monkeypatch):
    """qwen3-moe: the mode wraps each router's forward (kernels/router.py); torch rebuilds a saved
    function's guards on it when loading, which failed while the wrapper borrowed the router class's name
    (every load compiled again). falcon: its direct F.scaled_dot_product_attention call went through the
    mode's aten override, whose mask read a full-graph trace refuses (the step ran the JIT compile); the
    traced mode now routes it. aot_eager: the same save and load path as Inductor, in seconds."""
    import family_models as fm

    from nondet.probes.models.default_model import build_tokenizer
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe

    moe = fm.save_family(family, tmp_path / family, build_tokenizer(512))
    monkeypatch.setenv("NONDET_CACHE", str(tmp_path / "cache"))
    saved = []
    for name in ("first", "second"):
        config = ProbeConfig(prompt=PROMPT, model=ModelSpec(name=moe), batch_sizes=(1,), max_new_tokens=3,
                             kernels=("batch-invariant",), compile_backend="aot_eager", out=str(tmp_path / name))
        saved.append(run_probe(config).summary["decode_path"]["precompiled"])
    assert saved == [{"batch-invariant": {EVERY: "compiled and saved"}},
                     {"batch-invariant": {EVERY: "loaded"}}]


def test_the_aot_compile_method_is_asked_for_where_torch_leaves_it_off():
    """torch 2.11 (an H200 image's, 2026-11-28) keeps torch._dynamo.config.enable_aot_compile off, and
    torch.compile's wrapper then has no aot_compile: every saved step ran the JIT compile. The control is
    the plain torch.compile under the same setting, on this host."""
    import torch

    with torch._dynamo.config.patch(enable_aot_compile=False):
        assert not hasattr(torch.compile(torch.sin), "aot_compile")  # control: the failure seen on the device
        function = aot_step.aot_compilable(torch.sin, {"fullgraph": True, "backend": "eager"})
        assert hasattr(function, "aot_compile")
        assert torch._dynamo.config.enable_aot_compile is False  # the switch is restored


def test_a_guard_on_a_functions_defaults_is_saved_so_it_loads():
    """torch 2.11 pickled a guard source with its fields __init__ does not take, and loading a step guarded
    on a function's defaults raised TypeError (the mode's steps on an H200 image, 2026-11-28). Here torch
    2.11's way of pickling is put back as the control: it fails; inside the context manager it loads."""
    import dataclasses
    import pickle

    from torch._dynamo.source import DefaultsSource, LocalSource

    def every_field(source):  # torch 2.11's _guards.dataclass_with_cached_hash __reduce__
        return type(source), tuple(getattr(source, f.name) for f in dataclasses.fields(source))

    source = DefaultsSource(LocalSource("forward"), 1)
    held = DefaultsSource.__dict__.get("__reduce__")
    DefaultsSource.__reduce__ = every_field
    try:
        with pytest.raises(TypeError, match="positional arguments"):
            pickle.loads(pickle.dumps(source))
        with aot_step.guard_sources_pickled_by_init_fields():
            data = pickle.dumps(source)
        assert DefaultsSource.__reduce__ is every_field  # put back as it was
    finally:
        if held is None:
            del DefaultsSource.__reduce__
        else:
            DefaultsSource.__reduce__ = held
    assert pickle.loads(data).name == source.name == "L['forward'].__defaults__[1]"


def test_a_step_compiled_for_cuda_graphs_is_loaded_under_that_option(monkeypatch):
    """torch sets a loaded step's Inductor graph up at load time from the Inductor config in force then
    (triton.cudagraphs), not from the options it was compiled with: loaded plainly, a step compiled for CUDA
    graphs ran without them (an H200, 2026-11-28: the mode's decode 3.9 -> 25.2 s). The loader here records
    what torch would read; the control is torch's loader called as before."""
    import io

    import torch

    seen = []
    monkeypatch.setattr(torch.compiler, "load_compiled_function",
                        lambda fh: seen.append(torch._inductor.config.triton.cudagraphs) or "step")
    options = aot_step.compile_options(_Config(mode="reduce-overhead"))["options"]
    torch.compiler.load_compiled_function(io.BytesIO())  # control: the plain load, as before
    assert aot_step.load_step(io.BytesIO(), options) == "step"
    assert seen == [False, True]
    assert torch._inductor.config.triton.cudagraphs is False  # put back
    assert "guard_filter_fn" in options  # a torch.compile option, not Inductor's: left out of the patch


def test_a_trace_dynamo_restarts_to_specialise_a_float_is_traced_again():
    """In a process that compiled another model before (test_probe_compile's, then this file's MoE), dynamo
    had made a shared float symbolic and aot_compile raised TensorifyScalarRestartAnalysis: the step ran
    transformers' JIT compile. dynamo recorded which floats to specialise, so a second attempt succeeds."""
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis

    class Compiled:
        calls = 0

        def aot_compile(self, example):
            self.calls += 1
            if self.calls < 3:
                raise TensorifyScalarRestartAnalysis
            return f"traced {example}"

    assert aot_step.aot_compile(Compiled(), "inputs") == "traced inputs"
    with pytest.raises(TensorifyScalarRestartAnalysis):  # not for ever: dynamo's own retries are bounded too
        aot_step.aot_compile(Compiled(), "inputs", attempts=2)


def _probe(tmp_path, model_dir, name, cache, precompile=True):
    """One `probe --compile --confirm` in a new interpreter (no dynamo state carried over)."""
    env = dict(os.environ, NONDET_CACHE=str(cache), NONDET_PRECOMPILE="1" if precompile else "0")
    out = tmp_path / name
    r = cli_runner.run(["probe", "--model", model_dir, "-p", PROMPT, "-b", "1,2,3", "-n", "6", "--confirm", "--compile",
                        "--out", str(out)], timeout=900, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    streams = sorted((s["kernels"], s["condition_id"], json.dumps(s["steps"])) for s in
                     map(json.loads, (out / "streams.jsonl").read_text().splitlines()))
    return summary, streams


@pytest.mark.slow
def test_a_second_probe_loads_every_step_and_gives_the_same_bits(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("NONDET_TEST_SUBPROCESS", "1")  # cli_runner: a new interpreter, not a fork of this one
    cache = tmp_path / "cache"
    first, first_streams = _probe(tmp_path, tiny_model_dir, "first", cache)
    second, second_streams = _probe(tmp_path, tiny_model_dir, "second", cache)
    modes = ("default", "batch-invariant")
    # one trace per kernels mode served batch sizes 1, 2 and 3: a refusal would read "... (traced again: ...)"
    assert first["decode_path"]["precompiled"] == {m: {EVERY: "compiled and saved"} for m in modes}
    assert second["decode_path"]["precompiled"] == {m: {EVERY: "loaded"} for m in modes}
    assert second_streams == first_streams  # (the mode's invariance is test_probe_compile's, with its control)
    # the mode's graphs were compiled by the first run only: the census reads their findings from its store
    census = second["compiled_graph_census"]
    assert census["graphs_inspected"] == 0 and census["graphs_from_store"] >= 1 and census["uncovered"] == []
    # control: transformers' JIT compile, traced again in this process: the mode's bits are the same. The
    # default's need not be: the JIT compile specialises batch 1 and 2 (other graphs), the saved step does not
    jit, jit_streams = _probe(tmp_path, tiny_model_dir, "jit", cache, precompile=False)
    assert jit["decode_path"]["precompiled"] == {}
    assert [s for s in jit_streams if s[0] == "batch-invariant"] == [s for s in first_streams if s[0] == "batch-invariant"]
    assert os.listdir(cache / "precompiled")


def test_a_swapped_in_module_keys_apart(tiny_model_dir):
    """The injected batch-variant norm (or any module swapped in, a forward set on an instance, a hook) is
    another trace: a function saved without it must never be loaded for it."""
    from transformers import AutoModelForCausalLM

    from nondet.kernels.variant import make_batch_variant_norm

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    plain = step_key.module_structure(model)
    norm = model.model.layers[0].post_attention_layernorm
    model.model.layers[0].post_attention_layernorm = make_batch_variant_norm(norm)
    swapped = step_key.module_structure(model)
    model.model.layers[0].post_attention_layernorm = norm
    assert step_key.module_structure(model) == plain != swapped
    handle = model.lm_head.register_forward_hook(lambda module, args, out: out)
    assert step_key.module_structure(model) != plain
    handle.remove()
    model.lm_head.forward = lambda x: x  # a forward set on the instance
    assert step_key.module_structure(model) != plain
