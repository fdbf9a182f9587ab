"""The kernels mode whose conditions are decoding now, as the decoder names it (static/decoder.py).

A decode step does not know which of the probe's kernels modes it belongs to; the decoder says so around each
condition. The compiled path keeps a saved step per mode by that name (precompiled.py), and the CUDA-graph path
counts its steps per mode (captured.py).
"""

import contextlib

_STACK: list[str] = []


@contextlib.contextmanager
def decoding(mode: str):
    """The kernels mode the body decodes under."""
    _STACK.append(mode)
    try:
        yield
    finally:
        _STACK.pop()


def current() -> str:
    """The innermost decoding() mode; "default" outside any."""
    return _STACK[-1] if _STACK else "default"
