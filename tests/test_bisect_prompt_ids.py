"""bisect replays the token ids the probe fed the model (probes/bisect/probed_prompts.py).

Plain prompts now get the BOS the tokenizer adds (core/chat.py prompt_ids). A run directory probed before that
change has the same config.json and streams one token shorter (`prompt_tokens`), fed without it; bisect
re-tokenizes config.json's prompt, so it replayed such a run with the BOS: another input, whose reference did
not reproduce the probe's bits. The pre-change run here is probed for real, with the probe's tokenization
(core/batch.py prompt_ids) as it was: no special tokens. Controls: the BOS changes the reference's bits on
this model, so a replay with it cannot reproduce them; a current run is replayed with its BOS; a count the
BOS does not explain is refused in one line, exit 4.
"""

import json
import shutil

import pytest

import cli_runner
from model_fixtures import save_qwen3
from nondet.errors import RunDirError
from nondet.probes.bisect.bisect import BisectConfig
from nondet.probes.bisect_probe import run_bisect
from nondet.probes.core.batch import tokenize_inputs
from nondet.probes.models.loading import ModelSpec, load_model
from nondet.probes.probe import ProbeConfig, run_probe
from nondet.probes.static.bisect import probed_prompts
from nondet.rundir import RunDir
from nondet.rundir.reader import read_header_dict, read_stream_dicts

PROMPT = "one two three four"


def bos_tokenizer():
    """The tests' tokenizer, prepending <|bos|> to every text as Llama-3's does."""
    from tokenizers import processors

    from nondet.probes.models.default_model import build_tokenizer

    tokenizer = build_tokenizer(512)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", special_tokens=[("<|bos|>", tokenizer.bos_token_id)])
    return tokenizer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"current": a run probed with the BOS, "before": the same probe as it ran before the change} of a tiny
    Qwen3 with the injected batch-variant norm (its default kernels diverge: something to bisect)."""
    import nondet.probes.core.batch as batch

    root = tmp_path_factory.mktemp("bos")
    spec = ModelSpec(name=str(save_qwen3(root / "model", bos_tokenizer(), hidden=64, layers=2, heads=4, kv_heads=2,
                                         seed=1)), dtype="float32", inject_variance=True)

    def probe(name: str) -> str:
        run_probe(ProbeConfig(prompt=PROMPT, model=spec, batch_sizes=(1, 2), kernels=("default",), max_new_tokens=4,
                              out=str(root / name)))
        return str(root / name)

    current = probe("current")
    with pytest.MonkeyPatch.context() as patch:  # the probe's tokenization before the change: no special tokens
        patch.setattr(batch, "prompt_ids", lambda tok, text: tok(text, add_special_tokens=False)["input_ids"])
        before = probe("before")
    return {"current": current, "before": before, "tokenizer": load_model(spec).tokenizer}


def replayed_ids(run: str, tokenizer) -> list[int]:
    """The prompt's ids as bisect's replay builds them."""
    rd = RunDir(run)
    texts, fillers = probed_prompts(read_header_dict(rd)["config"], tokenizer, read_stream_dicts(rd))
    return tokenize_inputs(tokenizer, texts[0], fillers)[0]


def reference_steps(run: str) -> list[tuple]:
    ref = next(s for s in read_stream_dicts(RunDir(run)) if s["is_reference"])
    return [(s["token"], s["logprob"]) for s in ref["steps"]]


def test_a_run_probed_before_plain_prompts_got_their_bos_is_replayed_without_it(runs):
    tokenizer = runs["tokenizer"]
    with_bos, without = tokenizer(PROMPT)["input_ids"], tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    assert with_bos == [tokenizer.bos_token_id, *without]
    assert {s["prompt_tokens"] for s in read_stream_dicts(RunDir(runs["before"]))} == {len(without)}
    # the control: the BOS changes the reference's bits, so a replay with it could not reproduce the probe
    assert reference_steps(runs["before"]) != reference_steps(runs["current"])
    assert replayed_ids(runs["before"], tokenizer) == without
    result = run_bisect(BisectConfig(runs["before"], ablation=False, max_steps=3)).bisect
    assert result["reference_reproduced"] is True and result["reference_bits_reproduced"] is True
    assert result["first_numeric_step"] is not None


def test_a_current_run_is_replayed_with_its_bos(runs):
    tokenizer = runs["tokenizer"]
    assert replayed_ids(runs["current"], tokenizer) == tokenizer(PROMPT)["input_ids"]
    result = run_bisect(BisectConfig(runs["current"], ablation=False, max_steps=3)).bisect
    assert result["reference_reproduced"] is True and result["reference_bits_reproduced"] is True


def test_a_count_the_bos_does_not_explain_is_refused_in_one_line(runs, tmp_path):
    run = tmp_path / "edited"
    shutil.copytree(runs["current"], run)
    for name in ("bisect.json", "bisect_modules.csv", "ablation.json"):  # the current run's bisect, if it ran first
        (run / name).unlink(missing_ok=True)
    streams = [json.loads(line) for line in (run / "streams.jsonl").read_text().splitlines()]
    n = streams[0]["prompt_tokens"]
    (run / "streams.jsonl").write_text("".join(json.dumps({**s, "prompt_tokens": n - 2}) + "\n" for s in streams))
    with pytest.raises(RunDirError):
        replayed_ids(str(run), runs["tokenizer"])
    r = cli_runner.run(["bisect", run, "--no-ablation"])
    assert r.returncode == 4
    assert r.stderr.strip() == (f"nondet: error: streams.jsonl records prompt 0 as {n - 2} tokens and the model's "
                                f"tokenizer gives it {n} now: not the tokenizer the probe ran with, so bisect cannot "
                                "replay the probe's input; rerun `nondet probe` with this model and bisect that run")
    assert not (run / "bisect.json").exists()
