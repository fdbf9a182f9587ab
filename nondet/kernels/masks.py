"""What an attention mask lets a query see, shared by the Triton launcher's index arithmetic (ops) and
the CPU path (cpu)."""

import torch


def visible(mask: torch.Tensor) -> torch.Tensor:
    """Bool, mask's shape: the positions a bool or additive float mask lets a query see (a float mask
    hides a position with a value below its dtype's min / 2, as transformers' masks do)."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
