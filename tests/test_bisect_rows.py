"""bisect on an every-row-a-target batch: the batch of several prompts is rebuilt exactly.

Positive control independent of the host's BLAS: one norm made batch-variant on purpose, the
other op classes held batch-invariant in every replay, so the injected norm is the origin.
"""

import json

from nondet.probes.bisect import BisectConfig
from nondet.probes.bisect_probe import run_bisect
from nondet.probes.core.corpus import DEMO_PROMPTS
from nondet.probes.models.loading import ModelSpec
from nondet.probes.probe import ProbeConfig, run_probe

SAME_LENGTH = (DEMO_PROMPTS[0], DEMO_PROMPTS[2], DEMO_PROMPTS[3])  # 5 tokens each in the demo tokenizer


def test_bisect_rebuilds_a_rows_batch_and_names_the_injected_norm(tmp_path):
    run = tmp_path / "run"
    probe = run_probe(ProbeConfig(prompts=SAME_LENGTH, model=ModelSpec(inject_variance=True), batch_sizes=(1, 2),
                                  placement="rows", max_new_tokens=8, out=str(run)))
    conditions = [json.loads(x) for x in (run / "conditions.jsonl").read_text().splitlines()]
    rows = [c for c in conditions if len([k for k in c.get("row_prompts", []) if k >= 0]) > 1]
    assert rows, "no batch held two prompts: the test would not exercise row_prompts"
    assert probe.summary["modes"]["default"]["first_numeric_divergence"] is not None
    result = run_bisect(BisectConfig(str(run), condition=rows[0]["condition_id"], max_steps=4, ablation=False,
                                     baseline=("matmul", "attention", "softmax")))
    b = result.bisect
    assert b["reference_reproduced"] is True  # the rebuilt reference decodes as the probe's did
    assert (b["origin"]["module"], b["origin"]["op_class"]) == ("model.layers.1.post_attention_layernorm", "norm")
