"""`--workers auto` (`workers = "auto"` in [tool.nondet]): how many processes decode a static CPU probe.

Each process holds its own copy of the weights, so the count is what the cores favour, capped by what
memory holds. The cores' share is measured (docs/benchmarks.md, the CPU gate against detLLM,
2026-11-30): on 2 cores, 2 processes of 1 thread ran the gate's work 1.24x faster than one process; on 4
Xeon cores, 4 processes of 1 thread 1.40x and 2 of 2 only 1.05x; on 16 Xeon cores, 4 processes of 4
threads 1.4-1.9x, 8 of 2 no better than 4. So: one process a core up to 4, then 4 up to 16 cores, then
a quarter of the cores, and no more than the cores hold at a pinned --threads.

A helper first imports torch and loads the model (2.6-3.3 s for the embedded model on a 2-core EPYC,
2026-11-30) on a core the parent shares, and the parent decodes on fewer threads meanwhile: on a short
sweep helpers cost time. So auto is 1 unless the sweep's decoding, estimated from its generate calls and
tokens at a floor of 2 ms a step (the embedded model's batch-1 step is 3.1-4.0 ms there), is at least
MIN_DECODE_SECONDS. Where the probe cannot use helpers (a GPU, --compile, --tp, a server, ...) or the
model's size or the free memory is unknown, auto is 1: a number given by hand is still refused there in
one line, auto never is.
"""

from pathlib import Path

from nondet.probes.core.child_process import usable_cores
from nondet.probes.core.model_files import loaded_bytes
from nondet.probes.static.workers import why_not_here

PROCESS_OVERHEAD_BYTES = 768 * 2**20  # a process's torch, transformers, KV cache and buffers beside the weights
MEMORY_SHARE = 0.7  # of the memory available now: the rest is the host's
STEP_SECONDS_FLOOR = 0.002  # the least a CPU decode step of generate takes (Python per-op cost), seconds
MIN_DECODE_SECONDS = 8.0  # ~2.5 helper start-ups: the single-process decoding below which helpers do not pay


def auto_count(config) -> int:
    """The processes `--workers auto` starts for this ProbeConfig (>= 1)."""
    if why_not_here(config) is not None or decode_steps(config) * STEP_SECONDS_FLOOR < MIN_DECODE_SECONDS:
        return 1
    cores = usable_cores()
    by_cores = min(cores, max(4, cores // 4))
    if config.threads:  # pinned (CPU results depend on it): no more processes than the cores hold at that count
        by_cores = min(by_cores, max(1, cores // config.threads))
    weights, free = weights_bytes(config.model), available_memory()
    if weights is None or free is None:
        return 1
    by_memory = int(free * MEMORY_SHARE // (weights + PROCESS_OVERHEAD_BYTES))
    return max(1, min(by_cores, by_memory))


def decode_steps(config) -> int:
    """About how many decode steps the static sweep runs: per kernels mode and trial, each target's reference
    alone, and at each batch size b > 1 at least ceil(targets / b) batches (a batch holds b targets at
    most), each of max_new_tokens steps."""
    targets = len(config.targets)
    calls = targets + sum(-(-targets // b) for b in config.batch_sizes if b > 1)
    return len(config.kernels) * config.trials * calls * config.max_new_tokens


def weights_bytes(spec) -> int | None:
    """The bytes of the model's weights once loaded in spec.dtype, from its files (a local directory, the
    embedded default, or a hub id already in the local cache; core/model_files.loaded_bytes); None when they
    cannot be found offline."""
    folder = _local_folder(spec.name)
    return None if folder is None else loaded_bytes(folder, spec.dtype)


def _local_folder(name: str | None) -> Path | None:
    if name is None:
        from nondet.probes.models.demo_model import resolve_demo_dir

        return Path(resolve_demo_dir())
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    try:  # a hub id: its snapshot in the local cache only, never a download
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # noqa: BLE001 (not cached, not a repo id, no huggingface_hub: unknown size)
        return None


def available_memory() -> int | None:
    """Bytes this process may still allocate: the host's MemAvailable, or a cgroup's limit left if smaller."""
    values = [v for v in (_meminfo_available(), _cgroup_left()) if v is not None]
    return min(values) if values else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_left() -> int | None:
    """A container's memory limit less its use (cgroup v2, then v1); None without a limit."""
    for limit_file, used_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                   "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            used = int(Path(used_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 2**60:  # no limit (v1 writes a huge number)
            return None
        return max(0, int(limit) - used)
    return None
