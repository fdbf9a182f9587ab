"""Which experts each target token was routed to, recorded during the probe's generate.

A cheap forward hook on every MoE router (kernels/router.py: a *Router module; its output, or its
first element, is the router logits) keeps, per forward call, the
top-k expert ids of the target rows' last position (the token being produced). After generate the
ids are attached to each step record as "experts": one sorted list per MoE layer. summarize.py
compares them with the reference's, so the summary says whether a divergence went through the
routing ("routing changed in 3 of 7 runs, first at step 12, layer 2") or is arithmetic.
Dense models have no routers: nothing is hooked and nothing is added.
"""

from nondet.kernels.router import is_router


def routers(model) -> list[tuple[str, object, int]]:
    """(path, module, top_k) of every MoE router of the model, in forward order."""
    found = []
    for path, module in model.named_modules():
        if is_router(module):
            config = getattr(module, "config", None)
            top_k = getattr(module, "top_k", None) or getattr(config, "num_experts_per_tok", None)
            if top_k:
                found.append((path, module, int(top_k)))
    return found


class RoutingTrace:
    """Context manager: hooks the routers; `experts(row)` -> per forward call, per layer, sorted ids."""

    def __init__(self, model, target_rows, batch_size: int):
        self.found = routers(model)
        self.rows, self.batch_size = tuple(target_rows), batch_size
        self._calls: list = []  # per router call: top-k ids [rows, k], still on the device
        self._handles: list = []

    def __enter__(self) -> "RoutingTrace":
        for _, module, top_k in self.found:
            self._handles.append(module.register_forward_hook(
                lambda m, args, out, k=top_k: self._record(out[0] if isinstance(out, tuple) else out, k)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _record(self, logits, k: int) -> None:
        import torch

        if logits is None or logits.shape[0] % self.batch_size:
            return
        last = logits.reshape(self.batch_size, -1, logits.shape[-1])[list(self.rows), -1]  # [rows, experts]
        self._calls.append(torch.topk(last.float(), k, dim=-1).indices)

    def experts(self) -> dict[int, list[list[list[int]]]]:
        """{target row: [forward call -> [MoE layer -> sorted expert ids]]}."""
        layers = len(self.found)
        per_row: dict[int, list] = {row: [] for row in self.rows}
        for start in range(0, len(self._calls) - layers + 1, layers):
            step = [ids.tolist() for ids in self._calls[start:start + layers]]  # [layer][row][k]
            for i, row in enumerate(self.rows):
                per_row[row].append([sorted(layer[i]) for layer in step])
        return per_row
