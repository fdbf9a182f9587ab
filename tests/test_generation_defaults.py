"""A model's generation_config.json (repetition_penalty, no_repeat_ngram_size, ...) stays out of the probe's
greedy streams: transformers fills every field a generate call leaves unset from it, so these penalties
moved the recorded tokens and logprobs away from the model's own."""

import json
import shutil

import pytest

import cli_runner

PENALTIES = {"repetition_penalty": 3.0, "no_repeat_ngram_size": 2}
PROMPT = "one two three"


@pytest.fixture(scope="module")
def penalized_model(tiny_model_dir, tmp_path_factory):
    """tiny_model_dir with a generation_config.json that penalizes repeats (as many instruct models ship)."""
    model = shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("penalized") / "model")
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, **PENALTIES}))
    return model


def _reference(out) -> dict:
    return json.loads((out / "streams.jsonl").read_text().splitlines()[0])


def _probe(model, out):
    done = cli_runner.run(["probe", "--model", str(model), "-p", PROMPT, "-b", "1,2", "-n", "24", "--out", str(out)])
    assert done.returncode == 0, done.stderr
    return done


def test_the_probe_decodes_the_models_own_logits_and_names_what_it_did_not_apply(tiny_model_dir, penalized_model,
                                                                                  tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    done = _probe(penalized_model, tmp_path / "penalized")
    _probe(tiny_model_dir, tmp_path / "plain")
    plain, penalized = _reference(tmp_path / "plain"), _reference(tmp_path / "penalized")
    assert [s["token"] for s in penalized["steps"]] == [s["token"] for s in plain["steps"]]
    assert [s["logprob"] for s in penalized["steps"]] == [s["logprob"] for s in plain["steps"]]
    fingerprint = json.loads((tmp_path / "penalized" / "fingerprint.json").read_text())
    assert fingerprint["model"]["generation_defaults_ignored"] == PENALTIES
    said = " ".join(done.stdout.split())  # the terminal wraps the note
    assert "generation_config.json sets no_repeat_ngram_size=2, repetition_penalty=3.0, not applied" in said
    assert "generation_defaults_ignored" not in json.loads((tmp_path / "plain" / "fingerprint.json").read_text())["model"]
    # the control: transformers' generate with the model's defaults, as the probe called it before, picks other
    # tokens from the same prompt
    tokenizer = AutoTokenizer.from_pretrained(penalized_model)
    model = AutoModelForCausalLM.from_pretrained(penalized_model).eval()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    out = model.generate(ids, generation_config=GenerationConfig(do_sample=False, max_new_tokens=24,
                                                                 pad_token_id=tokenizer.pad_token_id))
    assert out[0, ids.shape[1]:].tolist() != [s["token"] for s in plain["steps"]][:out.shape[1] - ids.shape[1]]


def test_the_models_generation_config_is_restored_after_each_call(penalized_model):
    from transformers import AutoModelForCausalLM

    from nondet.probes.core.generation_defaults import without_model_defaults

    model = AutoModelForCausalLM.from_pretrained(penalized_model)
    saved = model.generation_config
    with without_model_defaults(model):
        assert model.generation_config.repetition_penalty in (None, 1.0)
        assert model.generation_config.eos_token_id == saved.eos_token_id
    assert model.generation_config is saved and saved.repetition_penalty == 3.0
