"""Arrival counters for the split launches, kept at zero between launches instead of zeroed per call.

A split launch (triton_matmul's split K, triton_attention's split KV) counts its programs' arrivals
per tile in int32 counters that must read zero when it starts; the last program of a tile stores
the zero back (triton_matmul._mm_kernel, triton_attention_merge.arrived_last), so after any launch
the counters it used are zero again. A buffer kept per device then serves every launch, where a fresh `torch.zeros` per launch
cost a memset each: ~100 extra nodes in a 16-layer 8B-shaped decode step's CUDA graph and ~0.2 ms
of cudaGraphLaunch host time per step (H200, 2026-11-26, docs/benchmarks.md).

One buffer must never serve two launches at once, so it belongs to one stream: the device's
default stream, the one it was made on. A launch there, or one being captured into a CUDA graph
(replayed, as transformers and torch.compile's CUDA graphs do, on the stream that runs the rest of
the model), takes the buffer; a launch on any other stream gets fresh zeros, as before. A graph
replayed on a side stream while the mode launches on the default stream concurrently would share
the counters: don't. Buffers are never freed: a captured graph keeps their address.

The buffer is made outside any capture and outside torch.compile's CUDA-graph memory pool (whose
warm-up runs on a side stream): at the first eager launch on the default stream, or when the mode
is entered (`reserve`). Inside a traced body (fake tensors) the counters are a graph node, fresh
zeros, as before.
"""

import torch

from nondet.kernels.launch import _plain

# int32 slots per device (256 KiB). A split launch uses one per tile (batch x row tiles x heads for
# attention); one needing more gets fresh zeros.
SLOTS = 1 << 16

_BUFFERS: dict[tuple[str, int | None], tuple[torch.Tensor, int | None]] = {}  # device -> (counters, stream)


def zeroed(n: int, like: torch.Tensor) -> torch.Tensor:
    """n int32 counters on like's device that read zero and that the launch leaves at zero."""
    if _plain(like) and n <= SLOTS:
        entry = _BUFFERS.get(_key(like.device)) or _make(like.device)
        if entry is not None and _owns(entry[1], like.device):
            return entry[0][:n]
    return torch.zeros(n, dtype=torch.int32, device=like.device)


def reserve(device: torch.device) -> None:
    """Make the device's buffer now, where this is safe (the default stream, no capture): the mode does
    on entry, so that a compiled model whose first split launch is captured finds it."""
    if buffer(device) is None:
        _make(device)


def buffer(device: torch.device) -> torch.Tensor | None:
    """The device's counters (SLOTS,) int32, or None before any were made."""
    entry = _BUFFERS.get(_key(device))
    return None if entry is None else entry[0]


def _make(device: torch.device):
    stream = _stream(device)
    if device.type == "cuda" and (stream != _default_stream(device) or torch.cuda.is_current_stream_capturing()):
        return None  # a side stream may allocate into a CUDA-graph pool; a capture must not allocate
    entry = (torch.zeros(SLOTS, dtype=torch.int32, device=device), stream)
    _BUFFERS[_key(device)] = entry
    return entry


def _key(device: torch.device) -> tuple[str, int | None]:
    return device.type, (_index(device) if device.type == "cuda" else device.index)


def _owns(stream: int | None, device: torch.device) -> bool:
    """Whether a launch now may use the buffer made on `stream`: on that stream, or into a capture."""
    if device.type != "cuda":
        return True  # the CPU (the Triton interpreter) runs launches one after another
    return _stream(device) == stream or torch.cuda.is_current_stream_capturing()


def _stream(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return torch._C._cuda_getCurrentRawStream(_index(device))  # ~1 us, where current_stream() builds an object


def _default_stream(device: torch.device) -> int:
    return torch.cuda.default_stream(_index(device)).cuda_stream


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()
