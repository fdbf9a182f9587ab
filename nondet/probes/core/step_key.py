"""The name of a saved decode step's file (precompiled.py): what the guards a saved function leaves out stood for.

torch saves no guard on object identities (the model, its modules, the kernels mode's functions), so
aot_step.GUARD_FILTER leaves them out and the file's key stands for them: the model's config, dtype,
device (a CPU's instruction set included) and module tree (module_structure: classes, instance forwards,
hooks), the kernels mode (kernels_state: the op classes on and the torch function modes), nondet's
source, the tuned table, torch's and transformers' versions and the compile options (a filter function
in them has no stable text: such a config compiles anew in each process).
"""

import functools
import hashlib
import json
from pathlib import Path


def step_key(model, compile_config, slot) -> str:
    """What a saved function's left-out guards stood for, hashed (sha256, 24 hex digits)."""
    import torch
    import transformers

    import nondet

    device = model.device
    doc = {"config": model.config.to_json_string(), "dtype": str(model.dtype), "modules": module_structure(model),
           "device": device.type, "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "",
           "cpu": cpu_instruction_set() if device.type == "cpu" else "",
           "slot": list(slot), "compile": repr(sorted((k, repr(v)) for k, v in compile_config.to_dict().items())),
           "torch": torch.__version__, "transformers": transformers.__version__, "nondet": nondet.__version__,
           "source": package_source_digest(), "tuning": _tuning_digest()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


def kernels_state() -> str:
    """What decides the kernels a traced step calls: the mode's op classes and the torch function modes
    on the stack (the traced mode routes functions to nondet:: ops through one)."""
    from torch.overrides import _get_current_function_mode_stack

    from nondet.kernels.mode import active_ops

    modes = ",".join(type(m).__qualname__ for m in _get_current_function_mode_stack())
    return f"ops {','.join(sorted(active_ops()))}; function modes {modes}"


def cpu_instruction_set() -> str:
    """The instruction set ATen's kernels and Inductor's generated C++ use here (ATEN_CPU_CAPABILITY picks
    both): a function compiled for AVX-512 must not be loaded where only AVX2, or the portable code, runs."""
    import torch

    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        inductor = str(pick_vec_isa())
    except Exception:  # noqa: BLE001 - a private module: its absence leaves ATen's capability alone
        inductor = ""
    return f"{torch.backends.cpu.get_cpu_capability()} {inductor}".strip()


def module_structure(model) -> str:
    """sha256 of the model's module tree as a trace sees it: each module's class (a swapped-in one, such as
    an injected batch-variant norm, included), a forward set on the instance and the forward hooks (the
    identity guards a saved function leaves out stood for these). Parameter values are not in it: a
    saved function reads them at each call."""
    def name(fn) -> str:
        fn = getattr(fn, "__func__", fn)
        return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"

    lines = []
    for path, module in model.named_modules():
        hooks = [*module._forward_pre_hooks.values(), *module._forward_hooks.values()]
        own = name(module.__dict__["forward"]) if "forward" in module.__dict__ else ""
        lines.append(f"{path} {name(type(module))} {own} " + ",".join(map(name, hooks)))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def package_source_digest() -> str:
    """sha256 of nondet's source (a saved graph holds the kernels and routes of the code that traced it)."""
    root = Path(__file__).resolve().parents[2]  # the nondet package
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _tuning_digest() -> str:
    from nondet.kernels.config import tuning_path

    path = tuning_path()
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""
