"""Recording on the device: the batched recorder's records equal, bit for bit, the
per-row computation (`step_record` on each row's [1, vocab] logits) on the same batch."""

import pytest

from nondet.probes.core.recorder import StepRecorder, step_record


class _PerRow:
    """The per-row recorder: each target row's step computed alone, every step."""

    def __init__(self, rows):
        self.rows, self.steps = rows, {r: [] for r in rows}

    def __call__(self, input_ids, scores):
        import torch

        chosen = torch.argmax(scores, dim=-1)
        for r in self.rows:
            self.steps[r].append(step_record(scores[r:r + 1].float(), int(chosen[r])))
        return scores


@pytest.mark.parametrize("kernels", ["default", "batch-invariant"])
def test_batched_records_equal_per_row_records_bit_for_bit(tiny_model_dir, kernels):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

    from nondet.probes.core.kernels_mode import kernels_mode

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    torch.manual_seed(0)
    ids = torch.randint(5, len(tok), (5, 7))  # 5 rows, 4 of them targets (irregular)
    rows = (0, 1, 3, 4)
    old, new = _PerRow(rows), StepRecorder(rows, 5, 0.0, 0)
    with kernels_mode(kernels, model), torch.inference_mode():
        for recorder in (old, new):
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                           min_new_tokens=12, pad_token_id=tok.pad_token_id,
                           logits_processor=LogitsProcessorList([recorder]))
    assert new.steps == old.steps
    assert len(new.steps[4]) == 12 and len(new.steps[4][0]["top"]) == 5


def test_steps_read_during_generation_then_after():
    # bisect's lockstep reads steps[row][-1] after every step: pending steps convert on read.
    import torch

    rec = StepRecorder((1,), 2, 0.0, 0)
    torch.manual_seed(0)
    logits = [torch.randn(2, 300) for _ in range(3)]
    rec(None, logits[0])
    assert rec.steps[1][-1] == step_record(logits[0][1:2], int(logits[0][1].argmax()))
    rec(None, logits[1])
    rec(None, logits[2])
    assert rec.steps[1] == [step_record(x[1:2], int(x[1].argmax())) for x in logits]


@pytest.mark.parametrize("rows,vocab", [(9, 151936), (3, 1823), (1, 50257)])
def test_batched_statistics_equal_per_row_with_ties(rows, vocab):
    # bf16-rounded logits: many exact ties in the top-6, where a different reduction or
    # selection order would show first.
    import torch

    torch.manual_seed(rows)
    logits = torch.randn(rows, vocab).bfloat16().float()
    rec = StepRecorder(tuple(range(rows)), rows, 0.0, 0)
    rec(None, logits)
    assert [rec.steps[r][0] for r in range(rows)] == [step_record(logits[r:r + 1], int(logits[r].argmax()))
                                                      for r in range(rows)]
