"""Model directories as real Hugging Face repos ship them, which the tests' models built in code do not: an EOS id
of 0, a BOS the tokenizer adds, a chat template that raises, a pad id past the vocabulary, a config.json that
leaves checkpoint tensors unused, fillers longer than the context."""

import json
import shutil
from types import SimpleNamespace

import pytest

import cli_runner


def test_an_eos_id_of_0_is_an_eos():
    """GPT-NeoX / Pythia, StarCoder and MPT end text with id 0; `config or tokenizer` read it as none. Control: a
    generation config without one falls back to the tokenizer's."""
    from nondet.probes.core.replay import eos_ids

    tokenizer = SimpleNamespace(eos_token_id=7)
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=0))
    assert eos_ids(model, tokenizer) == [0]
    model.generation_config.eos_token_id = [0, 3]
    assert eos_ids(model, tokenizer) == [0, 3]
    model.generation_config.eos_token_id = None
    assert eos_ids(model, tokenizer) == [7]


def _bos_tokenizer(add_bos: bool = True):
    """A small BPE tokenizer whose tokenizer.json prepends <|bos|> to every text, as Llama-3's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|pad|>", "<|eos|>", "<|bos|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(["one two three four five six seven"] * 20, trainer=trainer)
    if add_bos:
        bpe.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[
            ("<|bos|>", bpe.token_to_id("<|bos|>"))])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|pad|>", eos_token="<|eos|>", bos_token="<|bos|>")


def test_plain_prompts_and_fillers_get_the_bos_the_tokenizer_adds_and_templated_text_none_more():
    """`tokenizer(prompt)`, pipelines and a server's /v1/completions feed the model its BOS; the probe fed none.
    Control: a chat-rendered text already holds it and gets no second one; a tokenizer that adds none, none."""
    from nondet.probes.core.batch import tokenize_inputs
    from nondet.probes.core.chat import TemplatedText, prompt_ids

    tokenizer = _bos_tokenizer()
    bos = tokenizer.bos_token_id
    target, fillers = tokenize_inputs(tokenizer, "one two three", ["four five"])
    assert target == tokenizer("one two three")["input_ids"] and target[0] == bos
    assert fillers[0][0] == bos
    rendered = TemplatedText("<|bos|>one two")
    assert prompt_ids(tokenizer, rendered) == tokenizer("<|bos|>one two", add_special_tokens=False)["input_ids"]
    assert prompt_ids(tokenizer, rendered).count(bos) == 1
    plain = _bos_tokenizer(add_bos=False)
    assert tokenize_inputs(plain, "one two three", ())[0] == plain("one two three", add_special_tokens=False)["input_ids"]


GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\\n' + message['content'] "
    "+ '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")


def test_a_chat_template_that_refuses_the_messages_is_a_usage_error(tmp_path, tiny_model_dir):
    """Gemma's template raises on a system turn (Mistral's on roles that do not alternate): exit 2 in one line,
    not an internal error. Control: the same template renders a user turn."""
    from nondet.errors import UsageError
    from nondet.probes.core.chat import TemplatedText, chat_text

    tokenizer = _bos_tokenizer()
    tokenizer.chat_template = GEMMA_TEMPLATE
    with pytest.raises(UsageError, match="refused these messages: System role not supported; drop --system"):
        chat_text(tokenizer, "hi", system="be brief")
    rendered = chat_text(tokenizer, "hi")
    assert isinstance(rendered, TemplatedText) and rendered.startswith("<|bos|><start_of_turn>user")
    model = shutil.copytree(tiny_model_dir, tmp_path / "gemma-template")
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": GEMMA_TEMPLATE}))
    done = cli_runner.run(["probe", "--model", str(model), "-p", "one two", "--chat", "--system", "be brief",
                           "-b", "1,2", "-n", "2", "--out", str(tmp_path / "r")])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "the model's chat template refused these messages: System role not supported" in done.stderr


def test_ragged_fillers_and_rl_prompts_are_checked_against_the_context(tmp_path, tiny_model_dir):
    """--ragged puts fillers up to 2x the prompt in its batches, and rl never checked its prompts: past a
    learned-position model's context both were an IndexError (exit 70). Both refused before the model loads, exit 2.
    Control: the same prompt and -n without --ragged fit and run."""
    from nondet.probes.core.batch import longest_ragged_row

    assert [longest_ragged_row(10, b) for b in (1, 2, 3, 5, 64)] == [10, 10, 18, 20, 20]
    model = shutil.copytree(tiny_model_dir, tmp_path / "short")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 20}))
    prompt = "one two three"  # 8 tokens: 16 with -n 8 fit; a 1.75x filler at batch size 3 reaches 22
    args = ["--model", str(model), "-p", prompt, "-n", "8"]
    ragged = cli_runner.run(["probe", *args, "-b", "1,3", "--ragged", "--out", str(tmp_path / "r1")])
    assert ragged.returncode == 2 and ragged.stderr.startswith("nondet: error: with --ragged, a filler row beside "
                                                               "the prompt"), ragged.stderr
    (tmp_path / "prompts.txt").write_text(prompt + "\n")
    rl = cli_runner.run(["rl", "--model", str(model), "--prompts", str(tmp_path / "prompts.txt"), "-n", "30",
                         "--micro-batch", "1", "--out", str(tmp_path / "r2")])
    assert rl.returncode == 2 and "longer than the model's context of 20 tokens" in rl.stderr, rl.stderr
    plain = cli_runner.run(["probe", *args, "-b", "1,3", "--out", str(tmp_path / "r3")])
    assert plain.returncode == 0, plain.stderr


def test_checkpoint_tensors_the_model_does_not_use_are_a_warning_line(tmp_path, tiny_model_dir, recwarn):
    """A config.json of fewer layers than the weights (another size's) ran a smaller model, exit 0, with
    transformers' load report muted: now one `nondet: warning:` line names it (the run goes on: some checkpoints
    carry tensors no model reads). Control: a checkpoint whose every tensor is used warns nothing."""
    from transformers import AutoModelForCausalLM

    from nondet.probes.models.load_checks import check_weights_loaded

    model = shutil.copytree(tiny_model_dir, tmp_path / "fewer-layers")
    config = json.loads((model / "config.json").read_text())
    smaller = {**config, "num_hidden_layers": 1, "layer_types": config["layer_types"][:1]}
    (model / "config.json").write_text(json.dumps(smaller))
    done = cli_runner.run(["probe", "--model", str(model), "-p", "one two", "-b", "1,2", "-n", "2",
                           "--out", str(tmp_path / "r")])
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if line.startswith("nondet: warning:")]
    assert len(warned) == 1 and "tensor(s) of the weights are not used by Qwen3ForCausalLM (e.g. model.layers.1." \
        in warned[0], done.stderr
    _, info = AutoModelForCausalLM.from_pretrained(tiny_model_dir, output_loading_info=True)
    check_weights_loaded(str(tiny_model_dir), None, info)
    assert not [w for w in recwarn if "not used" in str(w.message)]


def test_a_config_json_whose_fields_contradict_each_other_is_exit_3(tmp_path, tiny_model_dir):
    """huggingface_hub's strict config validation raises its own exception class, none of the builtin ones: it was
    an internal error (exit 70). Control: the fields made consistent again load (the test above)."""
    model = shutil.copytree(tiny_model_dir, tmp_path / "contradicting")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))  # layer_types still 2
    done = cli_runner.run(["probe", "--model", str(model), "-p", "one two", "-b", "1,2", "-n", "2",
                           "--out", str(tmp_path / "r")])
    assert done.returncode == 3 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"nondet: error: cannot load model '{model}': ") and "layer_types" in done.stderr


def test_a_pad_id_past_the_embedding_table_pads_with_one_inside():
    """A [PAD] added without resizing the embeddings (some Llama-2 fine-tunes) made padded batches raise
    IndexError (exit 70): pad positions are masked, so the EOS pads instead (else id 0). Control: a pad id inside
    the table is kept."""
    import torch

    from nondet.probes.models.loading import pad_inside_vocabulary

    tokenizer = _bos_tokenizer()
    rows = len(tokenizer)
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    assert tokenizer.pad_token_id == rows  # one past the table
    model = SimpleNamespace(get_input_embeddings=lambda: torch.nn.Embedding(rows, 2))
    pad_inside_vocabulary(tokenizer, model)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id < rows
    inside = _bos_tokenizer()
    kept = inside.pad_token_id
    pad_inside_vocabulary(inside, model)
    assert inside.pad_token_id == kept


def test_a_stream_that_ends_at_eos_is_finished_by_eos():
    """streams.jsonl's finish was "length" for every stream, an EOS-ended one too (a server's says "stop"). Control:
    a stream cut by -n stays "length"."""
    from nondet.probes.core.replay import finish_reason

    assert finish_reason([5, 9, 2], [2]) == "eos"
    assert finish_reason([5, 9, 4], [2]) == "length"
    assert finish_reason([], [2]) == "empty"


def test_a_checkpoint_saved_in_another_dtype_is_named(tmp_path, tiny_model_dir):
    """The default --dtype bfloat16 casts a float16 checkpoint silently: the verdict is the bf16 model's. Named in
    the terminal, the report and fingerprint.json. Control: the same checkpoint probed in float16 names nothing."""
    model = shutil.copytree(tiny_model_dir, tmp_path / "half")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "dtype": "float16"}))
    for dtype, noted in (("bfloat16", True), ("float16", False)):
        out = tmp_path / dtype
        done = cli_runner.run(["probe", "--model", str(model), "-p", "one two", "-b", "1,2", "-n", "2",
                               "--dtype", dtype, "--out", str(out)])
        assert done.returncode == 0, done.stderr
        said = " ".join(done.stdout.split())
        assert ("its checkpoint is float16, probed in bfloat16 (--dtype float16 probes it as shipped)" in said) == noted
        fingerprint = json.loads((out / "fingerprint.json").read_text())["model"]
        assert fingerprint.get("checkpoint_dtype") == ("float16" if noted else None)


def test_a_model_with_its_own_code_names_the_flag_that_runs_it(tmp_path, tiny_model_dir):
    """transformers' refusal says `trust_remote_code=True`, its Python argument; the user's flag is
    --trust-remote-code. Control: the same directory without auto_map loads (the other tests here)."""
    model = shutil.copytree(tiny_model_dir, tmp_path / "own-code")
    config = json.loads((model / "config.json").read_text())
    auto_map = {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (model / "config.json").write_text(json.dumps({**config, "model_type": "x-model", "auto_map": auto_map}))
    done = cli_runner.run(["probe", "--model", str(model), "-p", "one two", "-b", "1,2", "-n", "2",
                           "--out", str(tmp_path / "r")])
    assert (done.returncode, done.stderr) == (3, f"nondet: error: cannot load model '{model}': it runs its own Python "
                                                 "code (auto_map in config.json); read it, then pass "
                                                 "--trust-remote-code to run it\n")


def test_a_config_that_stores_flash_attention_takes_the_flag_that_moves_it(tmp_path, tiny_model_dir):
    """A config.json saved on a GPU may store `_attn_implementation: flash_attention_2`: transformers keeps it over
    from_pretrained's argument, so on a host without flash-attn even `--attn-implementation sdpa` failed. Now the
    flag wins, and without it the error names the flag. Control: the run with the flag decodes."""
    model = shutil.copytree(tiny_model_dir, tmp_path / "flash")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "_attn_implementation": "flash_attention_2"}))
    case = ["probe", "--model", str(model), "-p", "one two", "-b", "1,2", "-n", "2"]
    plain = cli_runner.run([*case, "--out", str(tmp_path / "r1")])
    if plain.returncode == 0:
        pytest.skip("flash-attn is installed here: the stored implementation loads")
    assert plain.returncode == 3 and plain.stderr.endswith("; pass --attn-implementation sdpa\n"), plain.stderr
    moved = cli_runner.run([*case, "--attn-implementation", "sdpa", "--out", str(tmp_path / "r2")])
    assert moved.returncode == 0, moved.stderr
