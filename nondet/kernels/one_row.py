"""A switch the op census holds while it computes its reference, a request alone: a module built batch-variant on
purpose (variant.py, the injected norm) then computes its one-row formula whatever the rows. A lone request's
prefill has many rows, and the split path is the injected variance, not a kernel of the model's: in its bf16
partial sums an fp32 model's logits moved by 0.4 (the trained demo), so the census refused the demo in fp32
(2026-11-30). A leaf module: census.py and variant.py both read it, neither imports the other.
"""

import contextlib

_HELD = [False]


@contextlib.contextmanager
def one_row_paths():
    """Within: every injected norm computes the model's own formula (variant.BatchVariantRMSNorm)."""
    _HELD.append(True)
    try:
        yield
    finally:
        _HELD.pop()


def held() -> bool:
    return _HELD[-1]
