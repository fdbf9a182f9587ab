"""The split launches' arrival counters (nondet/kernels/counters.py): one buffer per device that every
split launch leaves at zero, instead of a memset per launch.

The kernel checks run under TRITON_INTERPRET=1 on the CPU (a fresh interpreter, as
tests/test_kernels_triton.py explains); with NONDET_TEST_DEVICE=cuda the same checks run compiled on a
GPU (scripts/gpu.sh split-tests), where the programs race, plus the stream and CUDA-graph rules.
"""

import os

import pytest
from interpreter import prepare_interpreter, rerun_under_interpreter

INNER = os.environ.get("NONDET_COUNTERS_INNER") == "1"

if not INNER:
    import torch

    from nondet.kernels import counters

    def test_kernel_launches_leave_the_counters_at_zero_under_interpreter():
        rerun_under_interpreter(__file__, "NONDET_COUNTERS_INNER")

    def test_a_device_buffer_serves_real_tensors_and_fresh_zeros_serve_the_rest():
        like = torch.empty(3)
        first = counters.zeroed(10, like)
        buffer = counters.buffer(like.device)
        assert first.data_ptr() == buffer.data_ptr() and first.shape == (10,) and not first.any()
        assert counters.zeroed(4, like).data_ptr() == buffer.data_ptr()  # the same slots again
        too_many = counters.zeroed(counters.SLOTS + 1, like)
        assert too_many.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
        assert not too_many.any()
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode() as fake_mode:  # a traced body: the counters are a node of the graph
            traced = counters.zeroed(10, fake_mode.from_tensor(like))
        assert type(traced) is not torch.Tensor and traced.shape == (10,)

else:
    import torch

    from nondet.kernels import counters, triton_attention, triton_matmul
    from nondet.kernels.config import AttentionConfig, MatmulConfig

    prepare_interpreter()
    DEVICE = os.environ.get("NONDET_TEST_DEVICE", "cpu")
    MM_CFG = MatmulConfig(block_m=16, block_n=16, block_k=16, k_chunk=32, group_m=2, num_warps=4, num_stages=1)
    ATT_CFG = AttentionConfig(block_m=16, block_n=16, kv_chunk=32, num_warps=4, num_stages=1)

    def device_buffer() -> torch.Tensor:
        return counters.buffer(torch.device(DEVICE))

    def operands(seed=0):
        g = torch.Generator().manual_seed(seed)
        # batch 3, K 70: three K chunks of 32, so the split launch counts three arrivals per tile
        return (torch.randn(3, 37, 70, generator=g).to(DEVICE), torch.randn(3, 70, 29, generator=g).to(DEVICE))

    def qkv(seed=0):
        g = torch.Generator().manual_seed(seed)  # 75 keys: chunks of 32, 32, 11
        return (torch.randn(3, 8, 1, 16, generator=g).to(DEVICE), torch.randn(3, 2, 75, 16, generator=g).to(DEVICE),
                torch.randn(3, 2, 75, 16, generator=g).to(DEVICE))

    def used_slots(monkeypatch) -> list:
        """Every counters tensor the launches take from now on."""
        taken, real = [], counters.zeroed

        def spy(n, like):
            taken.append(real(n, like))
            return taken[-1]
        monkeypatch.setattr(counters, "zeroed", spy)
        return taken

    def test_split_matmuls_take_the_device_buffer_and_leave_it_at_zero(monkeypatch):
        a, b = operands()
        fused = triton_matmul.bmm(a, b, cfg=MM_CFG, split=False)
        taken = used_slots(monkeypatch)
        for _ in range(5):  # each launch finds the zeros the one before left
            assert torch.equal(triton_matmul.bmm(a, b, cfg=MM_CFG, split=True), fused)
        assert len(taken) == 5 and all(t.data_ptr() == device_buffer().data_ptr() for t in taken)
        assert taken[0].numel() == 3 * 3 * 2  # (batch, tiles): 37 x 29 in 16 x 16 tiles
        assert not device_buffer().any()

    def test_split_attention_takes_the_device_buffer_and_leaves_it_at_zero(monkeypatch):
        q, k, v = qkv()
        fused = triton_attention.attention(q, k, v, split=False, cfg=ATT_CFG)
        taken = used_slots(monkeypatch)
        for _ in range(5):
            assert torch.equal(triton_attention.attention(q, k, v, split=True, cfg=ATT_CFG), fused)
        assert len(taken) == 5 and all(t.data_ptr() == device_buffer().data_ptr() for t in taken)
        assert not device_buffer().any()

    def test_a_launch_that_finds_counters_nonzero_misses_its_merges():
        """The control for the two above: counters that do not start at zero break the launch, so the
        zero each launch leaves is what the next one rests on. At 100 no program of a tile is the third
        arrival: nothing merges, nothing resets (100 + 3 left). (Wrong bits are not asserted: the
        workspace the caching allocator hands back can still hold the last launch's chunks.)"""
        a, b = operands(seed=1)
        triton_matmul.bmm(a, b, cfg=MM_CFG, split=True)
        assert not device_buffer().any()
        try:
            device_buffer()[:18] = 100
            triton_matmul.bmm(a, b, cfg=MM_CFG, split=True)
            assert torch.equal(device_buffer()[:18], torch.full_like(device_buffer()[:18], 103))
        finally:
            device_buffer().zero_()

    @pytest.mark.skipif(DEVICE != "cuda", reason="streams and CUDA graphs: a GPU")
    def test_other_streams_get_fresh_zeros_and_a_captured_graph_replays_on_the_buffer(monkeypatch):
        counters.reserve(torch.device(DEVICE))  # as the mode does on entry: a capture must not allocate it
        a, b = operands(seed=2)
        fused = triton_matmul.bmm(a, b, cfg=MM_CFG, split=False)
        taken = used_slots(monkeypatch)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = triton_matmul.bmm(a, b, cfg=MM_CFG, split=True)
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(on_side, fused) and taken[-1].data_ptr() != device_buffer().data_ptr()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = triton_matmul.bmm(a, b, cfg=MM_CFG, split=True)
        assert taken[-1].data_ptr() == device_buffer().data_ptr()
        for _ in range(20):
            captured.zero_()
            graph.replay()
            assert torch.equal(captured, fused)
        assert not device_buffer().any()
