"""Speculative decoding: the one-row decode vs k+1-row verification axis (issue 13)."""

import pytest
import torch

from nondet.kernels import cpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_attention_chunk_equals_one_row_decodes(dtype):
    """A k+1 verification chunk's query i == the one-token decode at its position, bit for bit."""
    torch.manual_seed(5)
    q = torch.randn(1, 4, 5, 16).to(dtype)
    k = torch.randn(1, 2, 30, 16).to(dtype)
    v = torch.randn(1, 2, 30, 16).to(dtype)
    chunk = cpu.attention(q, k, v, None, 0.25, [0])
    for i in range(5):
        solo = cpu.attention(q[:, :, i:i + 1], k[:, :, :26 + i], v[:, :, :26 + i], None, 0.25, [0])
        assert torch.equal(chunk[0, i], solo[0, 0])
