"""Compare one captured point of the reference and the divergent run, bit for bit.

Both tensors are the target request's row, already aligned (same shape). "Differs" means
any bit differs (so -0.0 vs +0.0 and NaN payloads count). The ULP distance is measured on
the integers that order floats monotonically, so adjacent floats are 1 apart across zero.
"""

from dataclasses import dataclass

_INT_OF = {2: "int16", 4: "int32", 8: "int64"}  # float element size -> same-width int view


@dataclass(frozen=True)
class Diff:
    differs: bool
    max_abs_diff: float  # max |ref - got| (computed in float64)
    max_rel_diff: float  # max |ref - got| / max(|ref|, |got|) (0 where both are 0; at most 2)
    max_ulp: int  # max distance in units in the last place of the captured dtype
    first_diff_index: int | None  # flat index (row-major) of the first element whose bits differ

    def to_row(self) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "max_rel_diff": self.max_rel_diff,
                "max_ulp": self.max_ulp, "first_diff_index": self.first_diff_index, "differs": self.differs}


SAME = Diff(False, 0.0, 0.0, 0, None)


def compare(ref, got) -> Diff:
    """ref, got: tensors of one shape and dtype -> Diff (SAME when bit-identical)."""
    a, b = bits(ref), bits(got)
    if a.equal(b):
        return SAME
    import torch

    x, y = ref.double().flatten(), got.double().flatten()
    abs_diff = (x - y).abs()
    scale = torch.maximum(x.abs(), y.abs())
    rel = torch.where(scale > 0, abs_diff / scale, 0.0)
    first = int((a != b).flatten().nonzero()[0, 0])
    return Diff(True, _finite_max(abs_diff), _finite_max(rel), ulp_distance(ref, got), first)


def bits(t):
    """The raw bits of a float tensor as a same-width int tensor (ints pass through)."""
    import torch

    if not t.dtype.is_floating_point:
        return t
    return t.contiguous().view(getattr(torch, _INT_OF[t.element_size()]))


def ulp_distance(ref, got) -> int:
    """Max over elements of |ordered(ref) - ordered(got)|; 0 for integer tensors."""
    if not ref.dtype.is_floating_point:
        return 0
    return int((_ordered(ref) - _ordered(got)).abs().max())


def _ordered(t):
    # Sign-magnitude bits -> an int64 that grows with the float's value (-0 and +0 both 0).
    import torch

    i = bits(t).flatten().long()
    lowest = -(1 << (8 * t.element_size() - 1))
    return torch.where(i < 0, lowest - i, i)


def _finite_max(t) -> float:
    """Max over finite entries (inf/nan come from inf/nan activations; the bits verdict has them)."""
    import torch

    finite = t.isfinite()
    return float(torch.where(finite, t, 0.0).max()) if bool(finite.any()) else float("inf")


def quick_compare(ref, got) -> Diff:
    """Only the bitwise verdict and the max abs diff (cheap: for steps not kept in the table)."""
    if bits(ref).equal(bits(got)):
        return SAME
    return Diff(True, _finite_max((ref.double() - got.double()).abs().flatten()), float("nan"), -1, None)
