"""The draft model runs the condition's kernels (SpeculativeSource._draft_kernels).

Under the mode the draft's attention goes through nondet's attention, as the target's does; with
default kernels it keeps its own; after the condition its implementation is put back. A draft the
mode cannot cover is refused in one line that says it is the draft.
"""

import pytest


@pytest.fixture(scope="module")
def draft_dir(tiny_model_dir, tmp_path_factory):
    from nondet.probes.speculative.default_draft import build_draft

    out = tmp_path_factory.mktemp("draft")
    build_draft(tiny_model_dir, 1, out)
    return str(out)


def _source(tiny_model_dir, draft_dir, kernels, compile_backend=None):
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig
    from nondet.probes.speculative.source import SpeculativeSource

    config = ProbeConfig(prompt="Tell me about Richard Feynman", model=ModelSpec(str(tiny_model_dir)),
                         max_new_tokens=6, kernels=kernels, speculative=(f"draft:{draft_dir}:2",),
                         compile_backend=compile_backend)
    source = SpeculativeSource(config)
    source.open()
    return source


def _draft_attention_while_drafting(source, planned) -> set[str]:
    """The draft model's attention implementation at each of its forwards during one condition. The
    condition is replayed once before: the mode's op census (taken once per model, cached) runs the
    draft with its own attention for its default-kernel reference, and is not one of the draft's
    forwards while drafting."""
    draft = source.drafts[planned.plan[1].name].model
    source.replay(planned, lambda stream: None)
    seen = set()
    handle = draft.register_forward_pre_hook(lambda module, args: seen.add(module.config._attn_implementation))
    try:
        source.replay(planned, lambda stream: None)
    finally:
        handle.remove()
    return seen


# transformers' assistant; nondet's StaticDraft (torch.compile on the CPU: the slow selection)
@pytest.mark.parametrize("compile_backend", [None, pytest.param("aot_eager", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kernels", ["default", "batch-invariant"])
def test_the_draft_runs_the_conditions_attention_and_gets_its_own_back(tiny_model_dir, draft_dir, kernels,
                                                                      compile_backend):
    from nondet.kernels.hf import ATTN_IMPLEMENTATION

    source = _source(tiny_model_dir, draft_dir, (kernels,), compile_backend)
    draft = next(iter(source.drafts.values())).model
    before = draft.config._attn_implementation
    spec = [p for p in source.plan() if p.plan[1] is not None]
    assert len(spec) == 1
    seen = _draft_attention_while_drafting(source, spec[0])
    assert seen == ({ATTN_IMPLEMENTATION} if kernels == "batch-invariant" else {before})
    assert before != ATTN_IMPLEMENTATION
    assert draft.config._attn_implementation == before
    found = source.open().fingerprint["speculative"]
    assert found["draft_kernels"].startswith("the condition's")
    assert ("StaticDraft" in next(iter(found["draft_decode"].values()))) == (compile_backend is not None)


def test_a_draft_the_mode_cannot_cover_is_one_line_naming_the_draft(tiny_model_dir, draft_dir, monkeypatch):
    from nondet.errors import UnsupportedModelError
    from nondet.kernels import coverage

    source = _source(tiny_model_dir, draft_dir, ("batch-invariant",))
    draft = next(iter(source.drafts.values())).model
    real = coverage.uncovered
    monkeypatch.setattr(coverage, "uncovered",
                        lambda model: [("model.layers.0.mlp", "a stand-in reason")] if model is draft else real(model))
    spec = [p for p in source.plan() if p.plan[1] is not None][0]
    with pytest.raises(UnsupportedModelError) as info:
        source.replay(spec, lambda stream: None)
    assert str(info.value).startswith(f"--speculative draft:{draft_dir}:2: draft model: ")
    assert "model.layers.0.mlp" in str(info.value)
