"""Every numerics knob nondet touches, set in one place, scoped, and fingerprinted.

Nothing here runs at import time. `numerics_scope` sets the thread count (CPU results
depend on it: a reduction split over 2 threads sums in another order than over 1) and
leaves TF32 off, and restores the previous values in `finally`.
"""

import contextlib
import os
import platform
import sys


@contextlib.contextmanager
def numerics_scope(threads: int | None):
    import torch

    saved = (torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    try:
        if threads:
            torch.set_num_threads(threads)
        # TF32 off: fp32 matmuls must be IEEE so fp32 runs mean what they say.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        yield
    finally:
        torch.set_num_threads(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        torch.backends.cudnn.allow_tf32 = saved[2]


def fingerprint(model_description: dict, kernels: str) -> dict:
    """The environment a run's numbers came from (call inside numerics_scope)."""
    import torch
    import transformers

    return {
        "nondet": _version("nondet"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": _version("triton"),
        "cuda": torch.version.cuda,
        "device": _device_name(model_description.get("device", "cpu")),
        "dtype": model_description.get("dtype"),
        "threads": torch.get_num_threads(),
        # the vector instruction set torch's CPU kernels dispatch to (ATEN_CPU_CAPABILITY caps it): on the
        # CPU it picks their code, so two runs differ in bits across it even under the mode
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "attn_implementation": model_description.get("attn_implementation"),
        "kernels": kernels,
        "kernel_tuning": _tuning(model_description.get("device", "cpu"), kernels),
        "model": model_description,
    }


def _tuning(device: str, kernels: str) -> dict | None:
    """The tuned matmul table the batch-invariant mode loads on this GPU (None: the shipped one)."""
    import torch

    if "batch-invariant" not in kernels or not device.startswith("cuda"):
        return None
    from nondet.kernels.config import tuning_fingerprint

    return tuning_fingerprint(torch.device(device))


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({platform.processor() or platform.machine()})"


def _version(dist: str) -> str | None:
    if dist == "nondet":
        from nondet import __version__

        return __version__
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001 - absent package = None in the fingerprint
        return None
