"""torch's AOT precompile as the saved decode steps use it (precompiled.py): the compile options of a saved
function, its guard filter, its trace, save and load, and the shims the torch versions we support need
(2.11's aot_compile switch, 2.11's guard-source pickling, dynamo's float restart). transformers' own JIT
compile is here too: the fallback where torch cannot save a step, and what dynamic_jit.py marks shapes for.
"""

import contextlib
import dataclasses


def compile_options(compile_config) -> dict:
    """torch.compile's arguments for a saved function: the compile config's, one graph (AOT precompile
    takes one or nothing), and GUARD_FILTER with any filter the config has. torch.compile takes a mode or
    options, so "reduce-overhead" becomes the option it sets (CUDA graphs)."""
    options = compile_config.to_dict()
    mode = options.pop("mode", None)
    if mode not in (None, "default", "reduce-overhead"):
        raise ValueError(f"compile mode {mode!r} is not saved")
    extra = dict(options.get("options") or {})
    if mode == "reduce-overhead":
        extra["triton.cudagraphs"] = True
    extra["guard_filter_fn"] = _and(extra.get("guard_filter_fn"), GUARD_FILTER())
    return {**options, "fullgraph": True, "options": extra}


def _and(first, second):
    """A guard filter keeping what both keep (either may be None)."""
    if first is None:
        return second
    return lambda entries: [a and b for a, b in zip(first(entries), second(entries))]


def GUARD_FILTER():  # noqa: N802 - a factory named as the constant it stands for
    """Dynamo keeps every guard but the kinds torch cannot save (object identities)."""
    from torch._dynamo.guards import CheckFunctionManager

    unsaved = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    return lambda entries: [e.guard_type not in unsaved and not unsaved & set(e.derived_guard_types or ())
                            for e in entries]


def aot_compilable(function, options: dict):
    """torch.compile(function, **options) with its aot_compile method. torch attaches that method only
    where torch._dynamo.config.enable_aot_compile is on when the wrapper is made: on by default from
    torch 2.12, off in 2.11 (an H200 image's torch, 2026-11-28: every saved step fell back to JIT)."""
    import torch

    with torch._dynamo.config.patch(enable_aot_compile=True):
        return torch.compile(function, **options)


def aot_compile(compiled, example, attempts: int = 3):
    """compiled.aot_compile(example), traced again where dynamo asks to restart its analysis to specialise a
    Python float it had made symbolic (a float of another value seen earlier in this process, e.g. another
    model's eps: automatic dynamic). dynamo's JIT restarts by itself; aot_compile raises, having recorded
    which floats to specialise, so the next attempt succeeds."""
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis

    for _ in range(attempts - 1):
        try:
            return compiled.aot_compile(example)
        except TensorifyScalarRestartAnalysis:
            continue
    return compiled.aot_compile(example)


def load_step(file, options: dict):
    """torch.compiler.load_compiled_function(file) under the Inductor options the step was compiled with.
    A loaded step's Inductor graph is set up at load time from the Inductor config then in force, not the
    options saved with it (torch 2.11-2.13 read triton.cudagraphs there): loaded outside them, a step
    compiled for CUDA graphs ran without them (an H200, 2026-11-28: the mode's decode 3.9 -> 25.2 s)."""
    import torch

    inductor = torch._inductor.config
    known = inductor.get_config_copy()
    with inductor.patch({k: v for k, v in options.items() if k in known}):
        return torch.compiler.load_compiled_function(file)


@contextlib.contextmanager
def guard_sources_pickled_by_init_fields():
    """While a step's guards are saved, each guard source pickles as its class and its __init__ fields.
    torch 2.11 pickled every dataclass field, also those __init__ does not take (DefaultsSource's field
    and _name, set in __post_init__), so loading a step guarded on a function's defaults raised
    "DefaultsSource.__init__() takes from 3 to 4 positional arguments but 6 were given" and the mode's
    steps were traced again in every process. torch 2.13 pickles the __init__ fields only, as here."""
    from torch._guards import Source

    patched = [cls for cls in _subclasses(Source)
               if dataclasses.is_dataclass(cls) and not all(f.init for f in dataclasses.fields(cls))]
    held = {cls: cls.__dict__.get("__reduce__") for cls in patched}
    for cls in patched:
        cls.__reduce__ = _reduce_by_init_fields
    try:
        yield
    finally:
        for cls, reduce in held.items():
            if reduce is None:
                del cls.__reduce__
            else:
                cls.__reduce__ = reduce


def _reduce_by_init_fields(source):
    return type(source), tuple(getattr(source, f.name) for f in dataclasses.fields(source) if f.init)


def _subclasses(cls) -> list:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def transformers_jit(model, compile_config, call=None):
    """transformers' own compiled call (get_compiled_call's): for a mode and batch torch could not save; `call`
    in place of the model's own (dynamic_jit.py: the model's call after a check on its inputs)."""
    import torch

    return torch.compile(call or model.__call__, **compile_config.to_dict())
