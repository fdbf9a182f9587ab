"""`--cuda-graphs`: the mode's Triton binaries compiled by a second process beside the probe (compile_ahead.py runs it).

Under `--cuda-graphs` nothing is traced; what a cold probe compiles is the mode's Triton binaries, a tile per
matmul M range and prompt length (on an H200 the mode's warm-ups took 4.6-5.1x the default's from an empty
cache, 0.5x warm: docs/benchmarks.md, 2026-12-01). The second process runs the mode's warm-ups alone, every
batch shape of the probe, the last first (ahead_process.py), and leaves the binaries in Triton's on-disk cache
under NONDET_CACHE, where the probe's own launches find them. It starts with the probe's model load, not after
it, where the checkpoint is a local folder whose size says whether the GPU holds another copy (before_load).

The probe does not wait for it: a kernel not there yet is compiled here as without it (the same source and
options give the same binary), so it can only take work off the probe; it runs at a lower priority (NICE in
ahead_process.py), since Triton's compiler is threaded and the probe's decode is bound by its host thread.
It is stopped once every condition ran. Binaries, not numbers, are what it hands over.

Where an earlier probe of the same plan ran every condition of the mode on this path, with the same Triton
cache, versions and GPU, its binaries are all there: the probe leaves a marker under NONDET_CACHE (mark), and
a later one starts no second process (is_marked), which would only load them again beside the probe (on an
H200 a warm probe took 2-2.7 s longer with it, 2026-12-01). A marker whose binaries were removed since costs
the probe the compiles it would make without a second process.
"""

import hashlib
import json
import os
from dataclasses import asdict, replace
from pathlib import Path

WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".gguf")
MARKERS = "kernels-ahead"  # under NONDET_CACHE: an empty file per plan whose binaries a probe compiled (mark)


def modes(config) -> tuple[str, ...]:
    """The kernels modes whose Triton binaries a second process compiles; the default kernels (cuBLAS, SDPA)
    compile nothing. The first mode too, where it is the batch-invariant one: the second process starts from
    the other end of the plan."""
    return tuple(mode for mode in config.kernels if mode != "default")


def warm_up_config(config, mode: str):
    """The second process's probe: every condition of `mode` as the probe plans them (each batch shape is a
    binary's M range and a prompt length), warmed up and not decoded; no run directory, no --workers, no
    --budget (its plan is the probe's whole plan)."""
    return replace(config, kernels=(mode,), out=None, argv=(), workers=1, budget=None)


def configured_device(config):
    """The device the probe will load its model on (--device), as a torch.device."""
    import torch

    return torch.device(config.model.device)


def before_load(config) -> int | None:
    """Before the probe's load: the bytes the weights will take on the GPU, from a local checkpoint folder's
    weight files (16-bit files read as float32 count twice), or None where that is known only after the load
    (a hub id, the embedded model)."""
    folder = _local_folder(config)
    if folder is None or not folder.is_dir():
        return None  # a hub id or the embedded model; a missing folder the load names
    stored = sum(p.stat().st_size for p in folder.iterdir() if p.suffix in WEIGHT_FILES and p.is_file())
    if not stored:
        return None
    return stored * (2 if config.model.dtype == "float32" else 1)


def outcome(started: float, took: float | None, code: int | None, beside: float | None, last_line: str) -> str:
    """What the second process did, in words (summary.json decode_path.compiled_ahead). started: its start
    (time.time()); took: start to its good end, where it wrote one; code: its exit code, None while it runs;
    beside: when the probe began the mode with it still running."""
    import time

    if code == 0 and took is not None:
        where = ("before the mode began" if beside is None
                 else f"{max(0.0, started + took - beside):.1f} s of it beside the mode")
        return f"kernels compiled by a second process in {took:.1f} s ({where})"
    if code is None:
        return (f"kernels compiled by a second process beside the mode; stopped at the probe's end, "
                f"{time.time() - started:.1f} s after its start")
    return f"second process failed (exit {code}: {last_line}): kernels compiled here"


def is_marked(config, mode: str) -> bool:
    """Whether an earlier probe of this plan ran every condition of `mode` with this Triton cache, these
    versions and this GPU (mark): its binaries are in the cache."""
    return marker(config, mode).exists()


def mark(config, mode: str) -> None:
    """After a probe ran every condition of `mode` on the CUDA-graph path: its binaries are in the cache. A
    marker that cannot be written is only a later probe's second process started again."""
    path = marker(config, mode)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass


def marker(config, mode: str) -> Path:
    """The marker's path: a hash of what the mode's binaries follow from (the plan as the second process
    would run it, the model's config.json where it is a local folder, the Triton cache folder, torch's,
    Triton's and nondet's versions, the GPU's name)."""
    import torch
    import triton

    import nondet
    from nondet.probes.core.cache_dir import TRITON_CACHE_ENV, cache_root

    device = configured_device(config)
    what = {"plan": asdict(warm_up_config(config, mode)), "model_config": _model_config(config),
            "triton_cache": os.environ.get(TRITON_CACHE_ENV),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
            "versions": [torch.__version__, triton.__version__, nondet.__version__]}
    key = hashlib.sha256(json.dumps(what, sort_keys=True, default=repr).encode()).hexdigest()[:32]
    return cache_root() / MARKERS / key


def _model_config(config) -> str | None:
    """A local model folder's config.json, as text (the shapes the binaries follow), else None (a hub id,
    the embedded model: their name, in the plan, stands for it)."""
    from nondet.probes.models.loading import MODEL_CONFIG

    folder = _local_folder(config)
    if folder is None:
        return None
    try:
        return (folder / MODEL_CONFIG).read_text()
    except OSError:
        return None


def _local_folder(config) -> Path | None:
    """The model's folder where --model names a local one, else None (a hub id, the embedded model)."""
    from nondet.probes.models.loading import is_local_path

    name = config.model.name
    return Path(name).expanduser() if name is not None and is_local_path(name) else None
