"""SDPA on CUDA with a (B, 1, 1, L) mask against its row 0 broadcast over the batch: the same bits, eager and compiled?

    python3 scripts/device/gpu_sdpa_broadcast_mask.py

bf16 decode shapes (16 heads, one query, 230 keys of which the last 30 masked, head 64), B = 1 ... 128; eager, then
torch.compile(dynamic=True). The check behind not handing the default kernels' saved step one mask row
(docs/benchmarks.md, 2026-11-30: which batch sizes differ changed between runs, eager included).
"""

import torch
import torch.nn.functional as F


def main() -> None:
    torch.manual_seed(0)
    for compiled in (False, True):
        attend = torch.compile(F.scaled_dot_product_attention, dynamic=True) if compiled else F.scaled_dot_product_attention
        for batch in (1, 2, 4, 8, 16, 32, 64, 128):
            q = torch.randn(batch, 16, 1, 64, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(batch, 16, 230, 64, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(batch, 16, 230, 64, device="cuda", dtype=torch.bfloat16)
            mask = torch.zeros(batch, 1, 1, 230, device="cuda", dtype=torch.bfloat16)
            mask[..., 200:] = torch.finfo(torch.bfloat16).min  # the positions past the current step
            every_row, row_zero = attend(q, k, v, attn_mask=mask), attend(q, k, v, attn_mask=mask[:1])
            gap = (every_row.float() - row_zero.float()).abs().max().item()
            print(f"compiled={compiled} B={batch}: same bits {torch.equal(every_row, row_zero)}, max diff {gap:.3g}")


if __name__ == "__main__":
    main()
