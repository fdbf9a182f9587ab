"""The recorder's greedy steps from a CUDA graph (core/graphed_steps.py) give the eager recorder's records, bit for
bit: over more steps than its buffers hold (a conversion in the middle), after generate undoes steps (keep_first),
under default kernels and the batch-invariant mode, and a NaN row stops it at the same step. Control: a graph not
handed the step's logits (the copy into its input left out) makes other records, so the comparison sees the graph."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

ROWS, BATCH, VOCAB = (0, 3), 4, 1000


def logits_stream(steps: int, nan_at: int | None = None):
    g = torch.Generator(device="cuda").manual_seed(0)
    for step in range(steps):
        scores = torch.randn(BATCH, VOCAB, device="cuda", generator=g) * 4
        scores[1, :7] = float("-inf")  # masked vocabulary: valid, passes
        if step == nan_at:
            scores[3, 11] = float("nan")
        yield scores


def recorded(graphed: bool, steps: int, keep: int | None = None, nan_at: int | None = None):
    from nondet.probes.core.recorder import StepRecorder

    recorder = StepRecorder(ROWS, BATCH, 0.0, 0, graphed=graphed)
    for scores in logits_stream(steps, nan_at):
        assert recorder(None, scores) is scores  # greedy: generate's argmax reads the scores unchanged
    if keep is not None:
        recorder.keep_first(keep)
    return recorder.steps, recorder


@pytest.mark.parametrize("mode", ["default", "batch-invariant"])
def test_graphed_records_equal_eager_ones_across_a_conversion(mode):
    import contextlib

    from nondet.kernels import batch_invariant
    from nondet.probes.core.graphed_steps import CAPACITY

    steps = CAPACITY + 44
    with batch_invariant() if mode == "batch-invariant" else contextlib.nullcontext():  # log_softmax: ours
        graphed, recorder = recorded(True, steps)
        eager, _ = recorded(False, steps)
    assert recorder._graph is not None and recorder._graph.graph is not None  # the graph did record the steps
    assert all(len(graphed[r]) == steps for r in ROWS)
    assert graphed == eager


def test_keep_first_drops_the_same_steps():
    graphed, _ = recorded(True, 40, keep=31)
    eager, _ = recorded(False, 40, keep=31)
    assert len(graphed[0]) == 31 and graphed == eager


def test_a_nan_row_stops_the_graphed_recorder_at_its_step():
    from nondet.errors import NonFiniteLogitsError

    for graphed in (True, False):
        with pytest.raises(NonFiniteLogitsError) as caught:
            recorded(graphed, 30, nan_at=17)
        said = str(caught.value)
        assert "step 17" in said and "row 3" in said, said


def test_control_a_graph_not_handed_the_step_logits_records_other_steps(monkeypatch):
    from nondet.probes.core import graphed_steps

    def stale(self, scores):  # the replay without the copy into the graph's input
        if self.graph is None:
            self._record_graph(scores)
        else:
            self.graph.replay()
        self.count += 1

    monkeypatch.setattr(graphed_steps.GraphedSteps, "record", stale)
    graphed, _ = recorded(True, 12)
    eager, _ = recorded(False, 12)
    assert graphed[0][0] == eager[0][0] and graphed != eager
