"""generate's stop flag read a step late (core/deferred_stop.py): the records do not move.

On CUDA the probe lets transformers' DeferredStopCheck read "every row finished?" one step late, so
the host queues the next step while the GPU runs this one. When every row ends early, generate then
runs one step more and undoes it; the recorder saw that step and must drop it. The CPU has no
events, so here the check runs with a synchronous stand-in event (correct on the CPU, whose ops
finish before they return) and `defers_stop` answering yes: the same transformers code path the GPU
takes. The timing gain is measured on the GPU (scripts/device/gpu_tp_speed.py, NONDET_TP_DEFER_STOP).
"""

import pytest

from nondet.probes.core import replay
from nondet.probes.core.batch import build_batch
from nondet.probes.core.conditions import Condition
from nondet.probes.core.deferred_stop import deferred_stop_check, defers_stop
from nondet.probes.core.replay import DecodeSettings, generate, generate_condition, new_recorder

EOS_STEP = 3  # the target's 4th generated token is made its end of sequence


class _SyncEvent:
    """torch.Event for the CPU: every op has finished when it returns, so record and wait are no-ops."""

    def __init__(self, device=None, blocking=False):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from nondet.probes.models.loading import ModelSpec, load_model

    return load_model(ModelSpec(str(tiny_model_dir)))


@pytest.fixture
def deferring(monkeypatch):
    """The CPU can take the path CUDA takes (`_defer_here`); yields the steps each deferred call undid."""
    import torch
    from transformers.generation import utils

    monkeypatch.setattr(torch, "Event", _SyncEvent)
    undone = []
    finish = utils.DeferredStopCheck.finish

    def counted(self):
        undone.append(finish(self))
        return undone[-1]

    monkeypatch.setattr(utils.DeferredStopCheck, "finish", counted)
    return undone


def _defer_here(monkeypatch):
    monkeypatch.setattr(replay, "defers_stop", lambda device, assisted: not assisted)


def _solo(tok):
    target = tok("Tell me about Richard Feynman", add_special_tokens=False)["input_ids"]
    return build_batch(Condition("t/bs1/solo", "default", 1, (0,), "none"), target, [], tok.pad_token_id)


@pytest.fixture
def ends_early(tiny, monkeypatch):
    """The tiny model's greedy token at EOS_STEP made its end-of-sequence id (a token not chosen before)."""
    batch, settings = _solo(tiny.tokenizer), DecodeSettings(8, 0.0, 0)
    tokens = [s["token"] for s in generate_condition(tiny.model, tiny.tokenizer, batch, settings)[0]]
    assert tokens[EOS_STEP] not in tokens[:EOS_STEP], "pick another EOS_STEP: that token came earlier"
    monkeypatch.setattr(tiny.model.generation_config, "eos_token_id", tokens[EOS_STEP])
    return batch, settings


def test_records_are_the_same_with_the_stop_check_a_step_late(tiny, ends_early, deferring, monkeypatch):
    batch, settings = ends_early
    plain = generate_condition(tiny.model, tiny.tokenizer, batch, settings)
    assert deferring == []  # not deferred: the CPU's own rule
    _defer_here(monkeypatch)
    late = generate_condition(tiny.model, tiny.tokenizer, batch, settings)
    assert deferring == [1]  # deferred, and the step past EOS was run and undone
    assert late == plain and len(late[0]) == EOS_STEP + 1


def test_a_cache_passed_in_defers_too_and_the_records_stay(tiny, ends_early, deferring, monkeypatch):
    """The prefill axis hands generate its pieces' cache (a cache that would outlive the call, as the
    compiled path's held static cache does): the check is given none, defers, and the records stay."""
    import torch
    from transformers import DynamicCache
    from transformers.generation import utils

    _, settings = ends_early
    target = tiny.tokenizer("Tell me about Richard Feynman", add_special_tokens=False)["input_ids"]
    cut = Condition("t/bs1/chunk", "default", 1, (0,), "none", prefill="chunk:3", splits=(3,))
    batch = build_batch(cut, target, [], tiny.tokenizer.pad_token_id)
    crops = []
    crop = DynamicCache.crop
    monkeypatch.setattr(DynamicCache, "crop", lambda self, n: crops.append(n) or crop(self, n))
    waited = generate_condition(tiny.model, tiny.tokenizer, batch, settings)
    _defer_here(monkeypatch)
    late = generate_condition(tiny.model, tiny.tokenizer, batch, settings)
    assert deferring == [1] and late == waited and len(late[0]) <= EOS_STEP + 1
    assert crops == []  # the check never touched the cache
    # control: transformers' check given that cache crops it at its first step
    check = utils.DeferredStopCheck(torch.zeros(1, 2, dtype=torch.long), 10, DynamicCache(), True)
    check(torch.ones(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), 2)
    assert crops == [0]


def test_the_recorder_drops_the_step_generate_undid(tiny, ends_early, deferring, monkeypatch):
    batch, settings = ends_early
    _defer_here(monkeypatch)
    recorder = new_recorder(batch, settings)
    out = generate(tiny.model, tiny.tokenizer, batch, settings, recorder)
    generated = out.shape[-1] - len(batch.input_ids[0])
    assert deferring == [1] and generated == EOS_STEP + 1
    assert len(recorder.steps[0]) == generated
    # control: the undone step did reach the recorder
    monkeypatch.setattr(type(recorder), "keep_first", lambda self, steps: None)
    recorder = new_recorder(batch, settings)
    generate(tiny.model, tiny.tokenizer, batch, settings, recorder)
    assert len(recorder.steps[0]) == generated + 1


def test_calls_with_their_own_processors_or_criteria_keep_the_per_step_wait(tiny, ends_early, deferring,
                                                                           monkeypatch):
    from transformers import StoppingCriteria

    class Never(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            import torch

            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    batch, settings = ends_early
    _defer_here(monkeypatch)
    generate(tiny.model, tiny.tokenizer, batch, settings, new_recorder(batch, settings), stopping=[Never()])
    assert deferring == []  # the plain StopCheck
    generate(tiny.model, tiny.tokenizer, batch, settings, new_recorder(batch, settings))
    assert deferring == [1]  # control: the same call without the criterion defers


def test_the_check_is_put_back_after_the_call():
    import torch
    from transformers.generation import utils

    cls, cuda = utils.DeferredStopCheck, torch.device("cuda")
    originals = (cls.__dict__["is_supported"], cls.__dict__["__init__"])
    with pytest.raises(KeyError):
        with deferred_stop_check(True) as on:
            assert on and cls.__dict__["__init__"] is not originals[1]  # the cache-free constructor
            assert cls.is_supported(cuda, None, True, False)
            assert not cls.is_supported(cuda, None, False, True)  # assisted: its own loop
            raise KeyError
    assert (cls.__dict__["is_supported"], cls.__dict__["__init__"]) == originals
    with deferred_stop_check(False) as on:
        assert not on and (cls.__dict__["is_supported"], cls.__dict__["__init__"]) == originals


def test_only_cuda_defers():
    import torch

    assert defers_stop(torch.device("cuda"), assisted=False)
    assert not defers_stop(torch.device("cuda"), assisted=True)
    assert not defers_stop(torch.device("cpu"), assisted=False)


def test_the_rl_sampler_drops_undone_steps_too():
    import torch

    from nondet.probes.rl.processed import Processing
    from nondet.probes.rl.sampler import SampleRecorder

    recorder = SampleRecorder([1, 2], Processing(1.0, 0, 1.0), keep_distributions=True)
    for _ in range(3):
        recorder(None, torch.randn(2, 11))
    recorder.keep_first(2)
    assert [len(recorder.steps[r]) for r in (0, 1)] == [2, 2]
    assert [len(recorder.distributions[r]) for r in (0, 1)] == [2, 2]
