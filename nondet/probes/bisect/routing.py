"""Routing changes in a mixture of experts: did the divergent run send a token to other experts?

In an MoE a 1-ULP change before the router can flip a token's expert set, after which its numbers
come from a different function altogether; a reader must see that before any op-level detail. The
lockstep compares each router point's logits (target row, every position of the step); where the
bits differ, the top-k expert sets of the reference and the divergent run are compared too. The
first change is kept with the reference's margin between its k-th and (k+1)-th router logits: how
close the routing was to a tie.
"""


class RoutingWatch:
    """Fed by the lockstep's CompareSink with router points whose logits differ."""

    def __init__(self):
        self.first: dict | None = None  # the first change (bisect.json "routing")
        self.changes = 0  # (step, layer, position) router decisions that differ

    def check(self, step: int, point, ref, got) -> None:
        """ref, got: router logits of the target row, [positions, experts]."""
        import torch

        k = point.top_k
        ref_rows, got_rows = ref.float().reshape(-1, ref.shape[-1]), got.float().reshape(-1, got.shape[-1])
        ref_top = torch.topk(ref_rows, min(k + 1, ref_rows.shape[-1]), dim=-1)
        got_idx = torch.topk(got_rows, k, dim=-1).indices
        for pos in range(ref_rows.shape[0]):
            before = sorted(ref_top.indices[pos, :k].tolist())
            after = sorted(got_idx[pos].tolist())
            if before == after:
                continue
            self.changes += 1
            if self.first is None:
                values = ref_top.values[pos]
                margin = float(values[k - 1] - values[k]) if values.numel() > k else None
                self.first = {"step": step, "layer": point.layer, "module": point.module, "position": pos,
                              "reference_experts": before, "divergent_experts": after, "top_k": k,
                              "margin": margin}
