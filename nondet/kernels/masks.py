"""What an attention mask lets a query see, shared by the Triton launcher's index arithmetic (ops) and
the CPU path (cpu)."""

import torch

# What the Triton kernel loads a bool mask as: int16, not the bool's own bytes (triton_attention._mask_args
# says why). ops converts in the graph beside its other index arithmetic, where Inductor fuses the copy.
KERNEL_MASK_DTYPE = torch.int16


def visible(mask: torch.Tensor) -> torch.Tensor:
    """Bool, mask's shape: the positions a bool or additive float mask lets a query see (a float mask
    hides a position with a value below its dtype's min / 2, as transformers' masks do)."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def for_kernel(mask: torch.Tensor) -> torch.Tensor:
    """A mask as the Triton kernel loads it: a bool mask as KERNEL_MASK_DTYPE (0 = hidden), a float one as is."""
    return mask.to(KERNEL_MASK_DTYPE) if mask.dtype == torch.bool else mask
