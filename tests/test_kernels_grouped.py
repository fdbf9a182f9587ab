"""The invariant experts without a host sync (grouped.py, triton_grouped.py).

- the Triton grouped matmul, under TRITON_INTERPRET=1 on the CPU: each expert's rows get the bits the
  mode's mm gives them alone, for both weight layouts, with experts that got no row;
- grouped.combine gives the loop's bits (experts._combine) on every MoE family, invalid slots included;
- a negative control: a weight order the loop does not use gives other bits, so the comparison can fail.
"""

import os

import pytest
import torch
from interpreter import prepare_interpreter, rerun_under_interpreter

import family_models as fm

INNER = os.environ.get("NONDET_GROUPED_INNER") == "1"
MOE_FAMILIES = ("qwen3-moe", "mixtral", "gpt-oss", "deepseek-v3")


def _sorted_rows(counts: list[int], k: int, dtype, seed=0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(counts) + 3, k, generator=g).to(dtype)  # 3 rows past the experts' rows: left alone
    return x, torch.tensor(counts)


if not INNER:

    def test_grouped_kernel_under_interpreter():
        rerun_under_interpreter(__file__, "NONDET_GROUPED_INNER")

    def test_the_block_table_covers_each_experts_rows_once():
        from nondet.kernels.triton_grouped import block_table

        BLOCK_M = 16  # noqa: N806
        counts = torch.tensor([0, BLOCK_M + 1, 0, 3, BLOCK_M])
        expert, row, ends = block_table(counts, int(counts.sum()), BLOCK_M)
        real = expert < len(counts)
        assert expert.shape[0] == -(-int(counts.sum()) // BLOCK_M) + len(counts)
        assert expert[real].tolist() == [1, 1, 3, 4] and row[real].tolist() == [0, BLOCK_M, BLOCK_M + 1, BLOCK_M + 4]
        assert ends.tolist() == [0, BLOCK_M + 1, BLOCK_M + 1, BLOCK_M + 4, 2 * BLOCK_M + 4]
        assert (expert[~real] == len(counts)).all()

    @pytest.fixture(scope="module", params=MOE_FAMILIES)
    def moe(request, tmp_path_factory):
        directory = fm.save_family(request.param, tmp_path_factory.mktemp(request.param))
        return request.param, directory

    def _experts(model):
        from nondet.kernels import experts

        return experts.experts_modules(model)[0]

    def _routing(module, tokens: int, k: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        index = torch.stack([torch.randperm(module.num_experts, generator=g)[:k] for _ in range(tokens)])
        index[1, 0] = -1  # a slot routed nowhere (a padding convention): adds nothing in both paths
        return index, torch.rand(tokens, k, generator=g)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_the_grouped_combine_gives_the_loops_bits(moe, dtype):
        """k = 3 slots per token (the family routes 2; the experts take any k): their order of addition matters."""
        from nondet.kernels import batch_invariant, experts, grouped

        name, directory = moe
        module = _experts(fm.load(directory, dtype))
        x = torch.randn(29, fm.HIDDEN).to(dtype)
        index, weights = _routing(module, 29, 3)
        with torch.no_grad(), batch_invariant(ops={"experts", "matmul"}):
            loop = experts._combine(module, x, index, weights.to(dtype))
            ours = grouped.combine(module, x, index, weights.to(dtype))
            shuffled = grouped.combine(module, x, index[:, [2, 0, 1]], weights[:, [2, 0, 1]].to(dtype))
        assert torch.equal(ours, loop), f"{name}: {(ours.float() - loop.float()).abs().max().item()}"
        assert torch.equal(shuffled, loop)  # the order of additions follows the experts, not the slots

    def test_the_comparison_can_fail_slot_order_gives_other_bits(moe):
        """Negative control: a token's expert outputs added in slot order, not expert order, in fp32."""
        from nondet.kernels import batch_invariant, experts

        _, directory = moe
        module = _experts(fm.load(directory, torch.float32))
        x = torch.randn(64, fm.HIDDEN)
        index, weights = _routing(module, 64, 3, seed=3)
        weights = weights * torch.logspace(0, 3, 3)  # outputs of different sizes: the rounding shows
        with torch.no_grad(), batch_invariant(ops={"experts", "matmul"}):
            loop = experts._combine(module, x, index, weights)
            by_slot = torch.zeros(64, fm.HIDDEN)
            for j in range(3):  # one slot at a time: exactly that slot's fp32 contribution
                by_slot = by_slot + experts._combine(module, x, index[:, j:j + 1], weights[:, j:j + 1])
        assert not torch.equal(by_slot, loop)

    def test_training_forward_keeps_the_loop_and_its_gradients(moe):
        from nondet.kernels import grouped

        _, directory = moe
        module = _experts(fm.load(directory, torch.float32))
        x = torch.randn(3, fm.HIDDEN, requires_grad=True)
        assert not grouped.applies(x, module)
        with torch.no_grad():
            assert not grouped.applies(x.detach(), module)  # eager CPU: the loop (no Triton, nothing traced)

else:

    @pytest.fixture(autouse=True)
    def _rows_alone():
        prepare_interpreter()

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    @pytest.mark.parametrize("k", [128, 96])  # 96: a K that is no multiple of block_k (masked loads)
    @pytest.mark.parametrize("stored_out_in", [True, False])
    @pytest.mark.parametrize("tile", [None, (64, 128), (16, 64)])  # None: the pick for these shapes, (16, 64)
    def test_grouped_rows_get_the_bits_of_the_mm_alone(dtype, k, stored_out_in, tile):
        from nondet.kernels import triton_grouped, triton_matmul

        counts = [0, 19, 0, 1, 5]
        x, counts_t = _sorted_rows(counts, k, dtype)
        g = torch.Generator().manual_seed(1)
        n = 40  # no multiple of BLOCK_N: masked columns
        weight = torch.randn(len(counts), n, k, generator=g).to(dtype)  # (E, N, K), as nn.Linear stores
        w = weight.transpose(1, 2) if stored_out_in else weight.transpose(1, 2).contiguous()  # (E, K, N)
        out = triton_grouped.grouped_mm(x, w, counts_t, tile)
        start = 0
        for expert, rows in enumerate(counts):
            for row in range(start, start + rows):  # each row alone: M = 1, the decode bucket
                alone = triton_matmul.mm(x[row:row + 1], w[expert])
                assert torch.equal(out[row:row + 1], alone), (expert, row)
            if rows:
                together = triton_matmul.mm(x[start:start + rows], w[expert])  # the loop's call
                assert torch.equal(out[start:start + rows], together), expert
            start += rows
