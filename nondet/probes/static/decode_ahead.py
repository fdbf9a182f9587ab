"""The batch-invariant mode's conditions decoded by a second process beside the probe (eager or `--cuda-graphs`).

A probe's decode on a GPU is bound by its host thread: Python and kernel launches, one step after another
(on an H200, the GPU probe case's `--cuda-graphs --confirm` took 17.7-18.4 s warm in one process; the same
two kernels modes run as two probes at once, 15.0-15.1 s: docs/benchmarks.md, 2026-12-02). So where the
host has cores and the GPU memory to spare (compile_ahead.why_not), a second process started with the
probe's model load runs the probe's own static source under the mode and decodes the mode's conditions
from the last one back, while the probe decodes the default kernels and then the mode's from the front;
the two meet in the middle (rows_ahead.py: one claim per condition, rows handed over in files). On the
CUDA-graph path each process records the graphs of the shapes it decodes, so the mode's warm-ups are split
between them too.

What stays the same: the probe writes every row in plan order, run ids included; a condition is decoded
whole by one process; the default kernels (cuBLAS, SDPA: their choices are the library's) are always
decoded in the probe's own process, so the variance it shows is the one a single process has. The mode's
kernels give the same bits for the same inputs on the same GPU whichever process launches them, which is
what the mode claims; the GPU tests compare the streams with a run without the second process. A second
process that fails or dies leaves its unclaimed conditions, and the one it was on, to the probe.
"""

from dataclasses import replace
from pathlib import Path


def modes(config) -> tuple[str, ...]:
    """The kernels modes a second process decodes: every one but the default kernels, whose choices (cuBLAS,
    SDPA) stay in the probe's process. The first mode too, where it is the batch-invariant one: the second
    process starts from the other end of the plan."""
    return tuple(mode for mode in config.kernels if mode != "default")


def helper_config(config, mode: str):
    """The second process's probe: every condition of `mode` as the probe plans them; no run directory, no
    --workers, no --budget (its plan is the probe's whole plan)."""
    return replace(config, kernels=(mode,), out=None, argv=(), workers=1, budget=None)


def decode_from_the_end(source, folder: Path) -> int:
    """The second process's loop: the mode's conditions, the last first, each claimed and its rows handed
    over; it stops at the first one the probe claimed (the probe has every one before it). Returns how many
    it decoded."""
    from nondet.probes.static import rows_ahead

    done = 0
    for planned in reversed(source.plan()):
        if not rows_ahead.claim(folder, planned.condition_id):
            break
        rows_ahead.put(folder, planned.condition_id, source.decoded_rows(planned.plan))
        done += 1
    return done


def configured_device(config):
    """The device the probe will load its model on (--device), as a torch.device."""
    import torch

    return torch.device(config.model.device)


def before_load(config) -> int | None:
    """Before the probe's load: the bytes the weights will take on the GPU, from a local checkpoint folder's
    weight files (core/model_files.loaded_bytes), or None where that is known only after the load (a hub id,
    the embedded model, a GGUF)."""
    from nondet.probes.core.model_files import loaded_bytes

    folder = _local_folder(config)
    if folder is None or not folder.is_dir():
        return None  # a hub id or the embedded model; a missing folder the load names
    return loaded_bytes(folder, config.model.dtype)


def outcome(taken: int, here: int, waited: float, ran: float | None, code: int | None, last_line: str,
            stalled_s: float | None = None) -> str:
    """What the second process did, in words (summary.json). taken: conditions whose rows the probe took from
    it; here: the mode's conditions the probe decoded itself; waited: seconds the probe waited for rows; ran:
    its start to its good end, where it wrote one; code: its exit code, None where it was still running;
    stalled_s: it gave no rows for that long and was stopped."""
    share = f"{taken} of the mode's {taken + here} conditions decoded by a second process"
    if stalled_s is not None:
        return f"{share}; it gave no rows for {stalled_s:.0f} s and was stopped, the rest decoded here"
    if code not in (0, None):
        return f"{share}; it failed (exit {code}: {last_line or 'no output'}), the rest decoded here"
    took = f" in {ran:.1f} s" if ran is not None else ""
    return f"{share}{took} (the probe waited {waited:.1f} s for them)"


def _local_folder(config) -> Path | None:
    """The model's folder where --model names a local one, else None (a hub id, the embedded model)."""
    from nondet.probes.models.loading import is_local_path

    name = config.model.name
    return Path(name).expanduser() if name is not None and is_local_path(name) else None
