"""The recorder's per-step work replayed from one CUDA graph: greedy decoding on a GPU (`probe --cuda-graphs`).

StepRecorder (core/recorder.py) launches about a dozen small kernels a step for its target rows (argmax,
log-softmax, top-k, gathers, the non-finite flag) and keeps each step's tensors; on the GPU probe case their
launches were about 1 s of a warm 15-17 s probe (docs/benchmarks.md, 2026-12-01), where the model's own step
already replays from a graph. Here the same function of the step's logits is recorded once into a CUDA graph
that also writes its results into slot `n` of fixed buffers (a step counter on the device): each step is then
one copy of the logits into the graph's input and one replay. The graph replays the kernels it recorded, so
every record has the bits the eager recorder gives (tests/gpu/test_graphed_steps_gpu.py holds them equal, and
the CUDA-graph probe's records equal eager `--kv-cache static`'s: tests/gpu/test_cuda_graphs_gpu.py).

`capacity` steps fit; the recorder converts the buffers (one copy to the host) when they are full and at the
end. A graph is per recorder (one generate call: one batch shape and kernels mode).
"""

CAPACITY = 256  # steps held on the device before the recorder converts them (one host copy per CAPACITY steps)


class GraphedSteps:
    """fields_of(logits [B, vocab] fp32) -> tuple of tensors (each [R, ...]), recorded per step into slot n."""

    def __init__(self, fields_of, capacity: int | None = None) -> None:
        self.fields_of = fields_of
        self.capacity = capacity or CAPACITY
        self.count = 0  # steps held (the device counter's value, known here without a sync)
        self.graph = None
        self.logits = self.slot = None  # the graph's input [B, vocab] and its step counter (device, int64 [1])
        self.buffers: list = []  # per field [capacity, R, ...]

    def record(self, scores) -> None:
        """This step's fields into slot `count`: the first call records the graph (and runs the step once)."""
        if self.graph is None:
            self._record_graph(scores)
        else:
            self.logits.copy_(scores)
            self.graph.replay()
        self.count += 1

    def full(self) -> bool:
        return self.count >= self.capacity

    def held(self) -> list:
        """The held steps' fields, [count, R, ...] each: views of the buffers, to be read before the next record;
        then none are held (the counter back at 0)."""
        fields = [buffer[:self.count] for buffer in self.buffers]
        if self.slot is not None:
            self.slot.zero_()
        self.count = 0
        return fields

    def keep_first(self, steps: int) -> None:
        """Forget held steps past the first `steps` (generate undid them); later steps write after those kept."""
        self.count = min(self.count, max(0, steps))
        if self.slot is not None:
            self.slot.fill_(self.count)

    def _record_graph(self, scores) -> None:
        import torch

        self._buffers_for(scores)
        side = torch.cuda.Stream(device=scores.device)
        side.wait_stream(torch.cuda.current_stream(scores.device))
        with torch.cuda.stream(side):  # a warm-up on a side stream before recording, as CUDA graphs ask
            self._step()
        torch.cuda.current_stream(scores.device).wait_stream(side)
        self.slot.zero_()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()
        self.graph.replay()  # this step's own fields, into slot 0

    def _buffers_for(self, scores) -> None:
        """The graph's input (a copy of the first step's logits), its slot counter and the fields' buffers."""
        import torch

        self.logits = scores.clone()
        self.slot = torch.zeros(1, dtype=torch.long, device=scores.device)
        fields = self.fields_of(self.logits)  # eager once: the buffers' shapes, and first-call costs paid
        self.buffers = [torch.empty((self.capacity, *f.shape), dtype=f.dtype, device=f.device) for f in fields]

    def _step(self) -> None:
        for buffer, field in zip(self.buffers, self.fields_of(self.logits)):
            buffer.index_copy_(0, self.slot, field.unsqueeze(0))
        self.slot += 1
