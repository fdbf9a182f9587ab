"""The recorder's graphed greedy steps (core/graphed_steps.py) on the CPU, the CUDA graph stood in for by a replay
that runs the recorded step function again: slots, the conversion when the buffers are full, keep_first and the
non-finite check give the eager recorder's records. (On a GPU the real graph: tests/gpu/test_graphed_steps_gpu.py.)
Control: a stand-in replay that does not take the step's logits gives other records."""

import pytest
import torch

from nondet.errors import NonFiniteLogitsError
from nondet.probes.core import graphed_steps, recorder
from nondet.probes.core.recorder import StepRecorder

ROWS, BATCH = (0, 3), 4


class StandIn:
    """CUDAGraph's replay, as the step function run again on the graph's buffers."""

    def __init__(self, owner):
        self.owner = owner

    def replay(self):
        self.owner._step()


@pytest.fixture
def on_the_cpu(monkeypatch):
    def record_graph(self, scores):
        self._buffers_for(scores)
        self.graph = StandIn(self)
        self.graph.replay()

    monkeypatch.setattr(recorder, "graphable", lambda scores: True)
    monkeypatch.setattr(graphed_steps.GraphedSteps, "_record_graph", record_graph)
    monkeypatch.setattr(graphed_steps, "CAPACITY", 8)  # a conversion every 8 steps


def stream(steps: int, nan_at=None):
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        scores = torch.randn(BATCH, 50, generator=g) * 4
        scores[1, :5] = float("-inf")
        if step == nan_at:
            scores[3, 7] = float("nan")
        yield scores


def records(graphed: bool, steps: int, keep=None, nan_at=None):
    r = StepRecorder(ROWS, BATCH, 0.0, 0, graphed=graphed)
    for scores in stream(steps, nan_at):
        assert r(None, scores) is scores
    if keep is not None:
        r.keep_first(keep)
    return r


def test_graphed_steps_equal_eager_across_conversions_and_keep_first(on_the_cpu):
    graphed = records(True, 21)
    assert graphed._graph is not None and graphed._graph.capacity == 8
    assert graphed.steps == records(False, 21).steps and len(graphed.steps[0]) == 21
    assert records(True, 21, keep=13).steps == records(False, 21, keep=13).steps
    kept = records(True, 6, keep=4)  # undone steps inside the buffer: later steps write after the kept ones
    for scores in stream(3):
        kept(None, scores)
    eager = records(False, 6, keep=4)
    for scores in stream(3):
        eager(None, scores)
    assert kept.steps == eager.steps and len(kept.steps[3]) == 7


def test_a_nan_row_stops_at_its_step(on_the_cpu):
    with pytest.raises(NonFiniteLogitsError) as caught:
        records(True, 12, nan_at=9).steps
    assert "step 9" in str(caught.value) and "row 3" in str(caught.value)


def test_control_a_replay_without_the_step_logits_records_other_steps(on_the_cpu, monkeypatch):
    def stale(self, scores):
        if self.graph is None:
            self._record_graph(scores)
        else:
            self.graph.replay()
        self.count += 1

    monkeypatch.setattr(graphed_steps.GraphedSteps, "record", stale)
    graphed, eager = records(True, 5).steps, records(False, 5).steps
    assert graphed[0][0] == eager[0][0] and graphed != eager


def test_sampling_and_cpu_logits_keep_the_eager_recorder():
    assert StepRecorder(ROWS, BATCH, 0.7, 0, graphed=True).graphed is False
    r = records(True, 3)  # graphable() is False for CPU logits: no graph
    assert r._graph is None and r.steps == records(False, 3).steps


def test_a_graph_that_cannot_be_recorded_leaves_the_steps_eager(monkeypatch):
    def refuse(self, scores):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(recorder, "graphable", lambda scores: True)
    monkeypatch.setattr(graphed_steps.GraphedSteps, "_record_graph", refuse)
    r = records(True, 6)
    assert r.graphed is False and r._graph is None and r.steps == records(False, 6).steps
