"""The default kernels' saved decode step fed row 0 of the masks where no row is padded (probes/core/one_mask_row.py).

CUDA's SDPA guards a mask's batch size being 1 when traced at batch 1; on the CPU it does not, so the probe
test stands in an attention that branches on that size as CUDA's does (`_broadcasting_sdpa`, the same values
either way). Positive control: with NONDET_ONE_MASK_ROW=0 the function traced at batch 1 refuses batch 2 and a
second one is traced. With one mask row, one function serves every batch size, and the streams are the
control's bits. The probes compile with aot_eager: the same saved-step path as Inductor, in seconds.
"""

import json

import pytest
import torch

from nondet.probes.core import one_mask_row, precompiled

PROMPT = "Tell me about Richard Feynman"


def _broadcasting_sdpa(original):
    def attention(module, query, key, value, attention_mask, **kwargs):
        if attention_mask is not None and attention_mask.shape[0] == 1:  # CUDA's SDPA broadcasts such a mask
            attention_mask = attention_mask.expand(query.shape[0], *attention_mask.shape[1:])
        return original(module, query, key, value, attention_mask, **kwargs)
    return attention


def _streams(run_dir) -> dict:
    streams = {}
    for line in (run_dir / "streams.jsonl").read_text().splitlines():
        record = json.loads(line)
        streams[(record["condition_id"], record["position"])] = [(s["token"], s["logprob"]) for s in record["steps"]]
    return streams


def test_the_default_step_serves_every_batch_size_on_one_mask_row(tmp_path, tiny_model_dir, monkeypatch):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe

    mapping = ALL_ATTENTION_FUNCTIONS._global_mapping
    monkeypatch.setitem(mapping, "sdpa", _broadcasting_sdpa(mapping["sdpa"]))
    runs = {}
    for setting in ("1", "0"):  # "0": the control, every row's mask
        monkeypatch.setenv(one_mask_row.ENV, setting)
        monkeypatch.setenv("NONDET_CACHE", str(tmp_path / f"cache-{setting}"))  # cold: nothing saved before
        config = ProbeConfig(prompt=PROMPT, model=ModelSpec(name=str(tiny_model_dir)), batch_sizes=(1, 2, 3),
                             max_new_tokens=3, kernels=("default",), compile_backend="aot_eager",
                             out=str(tmp_path / f"run-{setting}"))
        runs[setting] = run_probe(config)
    one_row, control = (runs[s].summary["decode_path"]["precompiled"]["default"] for s in ("1", "0"))
    assert one_row == {precompiled.EVERY_BATCH: "compiled and saved"}, one_row
    assert precompiled.BATCH_MORE in control and "size()[0] == 1" in control[precompiled.BATCH_MORE], control
    streams = _streams(runs["1"].run_dir)
    assert len(streams) >= 5 and streams == _streams(runs["0"].run_dir)


def test_a_padded_call_and_the_mode_keep_every_rows_mask():
    masks = {"full_attention": torch.zeros(3, 1, 1, 5), "sliding_attention": torch.ones(3, 1, 1, 5)}
    inputs = {"input_ids": torch.zeros(3, 1), "attention_mask": masks}
    with one_mask_row.unpadded_rows([[1, 1], [1, 1], [1, 1]]):
        assert one_mask_row.applies(ops_on=False) and not one_mask_row.applies(ops_on=True)
        cut = one_mask_row.first_row(inputs)
        assert {kind: tuple(m.shape) for kind, m in cut["attention_mask"].items()} == {
            "full_attention": (1, 1, 1, 5), "sliding_attention": (1, 1, 1, 5)}
        assert cut["input_ids"] is inputs["input_ids"] and inputs["attention_mask"] is masks  # not changed in place
    with one_mask_row.unpadded_rows([[0, 1], [1, 1]]):  # a left-padded row
        assert not one_mask_row.applies(ops_on=False)
    assert not one_mask_row.applies(ops_on=False)  # outside a generate call
    assert one_mask_row.first_row({"attention_mask": None})["attention_mask"] is None
    two_d = torch.ones(3, 5)
    assert one_mask_row.first_row({"attention_mask": two_d})["attention_mask"] is two_d


def test_turned_off(monkeypatch):
    monkeypatch.setenv(one_mask_row.ENV, "0")
    with one_mask_row.unpadded_rows([[1, 1]]):
        assert not one_mask_row.applies(ops_on=False)
    monkeypatch.delenv(one_mask_row.ENV)
    with one_mask_row.unpadded_rows([[1, 1]]):
        assert one_mask_row.applies(ops_on=False)


@pytest.mark.parametrize("one_row", [True, False])
def test_a_traced_step_keeps_the_masks_batch_constant_and_its_length_symbolic(one_row):
    """symbolic_shapes: with one mask row the mask's batch dimension is not marked (a constant 1 in the
    trace), its key length is; without, both are, as the other batch-led tensors' batch is."""
    from nondet.probes.core.step_batch import symbolic_shapes

    mask, ids = torch.zeros(1, 1, 1, 5), torch.zeros(1, 1, dtype=torch.long)
    with symbolic_shapes({"input_ids": ids, "attention_mask": {"full_attention": mask}}, with_caches=False,
                         one_mask_row=one_row):
        pass
    assert mask._dynamo_weak_dynamic_indices == ({3} if one_row else {0, 3})
    assert ids._dynamo_weak_dynamic_indices == {0}
