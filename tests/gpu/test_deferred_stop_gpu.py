"""On CUDA the probe's generate reads its stop flag a step late (core/deferred_stop.py): the records of a
condition equal those of the per-step wait, eager and compiled, default kernels and the mode, also
when every row ends early (generate then runs a step more and undoes it)."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

EOS_STEP = 3


@pytest.fixture(scope="module")
def loaded(gpu_model_dir):
    from nondet.probes.models.loading import ModelSpec, load_model

    return load_model(ModelSpec(name=str(gpu_model_dir), device="cuda"))


@pytest.mark.parametrize("kernels", ["default", "batch-invariant"])
@pytest.mark.parametrize("backend", [None, "inductor"])
def test_records_equal_the_per_step_waits(loaded, kernels, backend, monkeypatch):
    from transformers.generation import utils

    from nondet.probes.core import replay
    from nondet.probes.core.conditions import Condition
    from nondet.probes.core.replay import DecodeSettings, replay_condition

    undone = []
    finish = utils.DeferredStopCheck.finish
    monkeypatch.setattr(utils.DeferredStopCheck, "finish", lambda self: undone.append(finish(self)) or undone[-1])
    tok = loaded.tokenizer
    target = tok("Tell me about Richard Feynman", add_special_tokens=False)["input_ids"]
    filler = tok("The quick brown fox", add_special_tokens=False)["input_ids"]
    settings = DecodeSettings(8, 0.0, 0, compile_backend=backend)
    solo = Condition("t/bs1", kernels, 1, (0,), "none")
    batch = Condition("t/bs3", kernels, 3, (1,), "same-length")

    def records(condition, deferred: bool):
        undone.clear()
        with monkeypatch.context() as m:
            if not deferred:
                m.setattr(replay, "defers_stop", lambda device, assisted: False)
            rows = replay_condition(loaded.model, tok, condition, target, [filler], settings)
        assert deferred or undone == []  # the per-step wait: transformers' plain check (not counted)
        return rows, list(undone)

    waited, _ = records(solo, deferred=False)
    late, counted = records(solo, deferred=True)
    assert counted == [0] and late == waited  # deferred (runs to max_new_tokens: nothing undone)
    tokens = [s["token"] for s in waited[0]]
    assert tokens[EOS_STEP] not in tokens[:EOS_STEP]
    monkeypatch.setattr(loaded.model.generation_config, "eos_token_id", tokens[EOS_STEP])
    for condition in (solo, batch):
        waited, _ = records(condition, deferred=False)
        late, counted = records(condition, deferred=True)
        assert late == waited
        assert len(counted) == 1
    assert counted[0] in (0, 1)  # the batch's fillers may run on past the target's EOS
    waited, _ = records(solo, deferred=False)
    late, counted = records(solo, deferred=True)
    assert counted == [1] and late == waited and len(late[0]) == EOS_STEP + 1  # the undone step dropped
