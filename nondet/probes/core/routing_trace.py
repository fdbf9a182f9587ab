"""Which experts each target token was routed to, recorded during the probe's generate.

A cheap forward hook on every MoE router (kernels/router.py: a *Router module; its output, or its
first element, is the router logits) keeps, per forward call, the
top-k expert ids of the target rows' last position (the token being produced). After generate the
ids are attached to each step record as "experts": one sorted list per MoE layer. summarize.py
compares them with the reference's, so the summary says whether a divergence went through the
routing ("routing changed in 3 of 7 runs, first at step 12, layer 2") or is arithmetic.
Dense models have no routers: nothing is hooked and nothing is added.

On the CUDA-graph path (core/captured.py) a replayed step runs no hook: the hook hands its ids to the graph while
the step is recorded (captured.keep), and the trace takes a copy of them after every replay.
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
        from nondet.probes.core import captured

        for _, module, top_k in self.found:
            self._handles.append(module.register_forward_hook(
                lambda m, args, out, k=top_k: self._record(out[0] if isinstance(out, tuple) else out, k)))
        if self.found:
            captured.listen(self._replayed)
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.found:
            from nondet.probes.core import captured

            captured.unlisten(self._replayed)

    def _record(self, logits, k: int) -> None:
        import torch

        if logits is None or logits.shape[0] % self.batch_size:
            return
        from nondet.probes.core import captured

        last = logits.reshape(self.batch_size, -1, logits.shape[-1])[:, -1]  # [batch, experts]
        ids = torch.topk(last.float(), k, dim=-1).indices  # every row's: a graph serves calls of other target rows
        if not captured.keep(ids):  # kept: a step being recorded, read after each replay (_replayed)
            self._calls.append(ids[list(self.rows)])

    def _replayed(self, kept: list) -> None:
        """After a replayed step: the target rows' ids its recording kept (one tensor per router, in forward
        order; indexing copies them out of the graph's memory)."""
        self._calls.extend(ids[list(self.rows)] for ids in kept)

    def experts(self) -> dict[int, list[list[list[int]]]]:
        """{target row: [forward call -> [MoE layer -> sorted expert ids]]}."""
        layers = len(self.found)
        per_row: dict[int, list] = {row: [] for row in self.rows}
        for start in range(0, len(self._calls) - layers + 1, layers):
            step = [ids.tolist() for ids in self._calls[start:start + layers]]  # [layer][row][k]
            for i, row in enumerate(self.rows):
                per_row[row].append([sorted(layer[i]) for layer in step])
        return per_row
