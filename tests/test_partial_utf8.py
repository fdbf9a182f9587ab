"""A byte-level BPE whose pieces are partial UTF-8, end to end: probe, bisect, report, gate.

Every byte-level BPE model (Qwen, Llama 3, GPT-2) has tokens that are half a character. Here
the tokenizer is trained on accented, CJK and emoji text with a small vocabulary, so many
tokens are 1-2 bytes of a 3-4 byte character, and a random model emits them. They must
round-trip through the run directory, pandas (with pyarrow's Arrow-backed strings and with
Python-backed ones), the terminal, Markdown and HTML, where they show as \\xNN.
"""

import json
import os
import re

import pytest
import cli_runner

TEXT = [
    "Café, naïve façade, São Paulo, Zürich, Ærøskøbing, crème brûlée, señor, Dvořák, Łódź.",
    "東京は日本の首都です。北京是中国的首都。서울은 대한민국의 수도입니다。",
    "Emoji: 😀😃😄😁🎉🚀🔥💡🧪🌍 and symbols ∑∫√∞≈≠ and arrows → ← ↑ ↓.",
    "Ελληνικά, русский язык, עברית, العربية, हिन्दी, ไทย.",
]

PROMPTS = ["Café 東京 😀", "naïve 北京 🚀", "Zürich Ærø ∑∫", "сеньор 서울 🔥"]


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|pad|>", "<|eos|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(TEXT * 3, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|pad|>", eos_token="<|eos|>",
                                   padding_side="left")


@pytest.fixture(scope="module")
def bpe_model_dir(tmp_path_factory):
    """A small random Qwen3 with that tokenizer, saved with save_pretrained (the real loading path).
    Hidden 512 x 4 layers: near-ties in its logits are common enough that the control flips tokens
    (a hidden-64 model's margins absorbed it over 64 steps)."""
    from model_fixtures import save_qwen3

    return save_qwen3(tmp_path_factory.mktemp("bpe-qwen3"), _tokenizer(), hidden=512, layers=4, heads=4,
                      kv_heads=2, seed=3)


def nondet(*args, cwd=None):
    env = {k: v for k, v in os.environ.items() if k not in ("NONDET_DEBUG", "GITHUB_ACTIONS")}
    return cli_runner.run(args, env=env, timeout=600, cwd=cwd)


@pytest.fixture(scope="module")
def probed(bpe_model_dir, tmp_path_factory):
    """`nondet probe` then `nondet bisect` on the BPE model, with the batch-variance control."""
    work = tmp_path_factory.mktemp("bpe-run")
    run = work / "run"
    (work / "prompts.txt").write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    probe = nondet("probe", "--model", str(bpe_model_dir), "--prompts", str(work / "prompts.txt"), "-b", "1,4",
                   "-n", "64", "--inject-variance", "--out", str(run))
    bisect = nondet("bisect", str(run), "--no-ablation")
    return run, probe, bisect


def _pieces(run) -> list[str]:
    return [s["piece"] for line in (run / "streams.jsonl").read_text().splitlines()
            for s in json.loads(line)["steps"]]


def test_the_tokenizer_really_has_partial_utf8_pieces():
    from nondet.probes.core.pieces import token_piece

    tok = _tokenizer()
    partial = [i for i in range(len(tok)) if any(0xDC80 <= ord(c) <= 0xDCFF for c in token_piece(tok, i))]
    assert len(partial) > 50  # half characters of CJK, emoji and accented letters


def test_probe_and_bisect_succeed_and_keep_the_raw_bytes(probed):
    run, probe, bisect = probed
    assert probe.returncode == 0, probe.stderr
    assert bisect.returncode == 0, bisect.stderr
    pieces = _pieces(run)
    raw = [p for p in pieces if any(0xDC80 <= ord(c) <= 0xDCFF for c in p)]
    assert raw, "the model emitted no partial-UTF-8 piece; the test would prove nothing"
    summary = json.loads((run / "summary.json").read_text())["modes"]["default"]
    assert summary["prompts_diverged"] >= 1  # a token diff, so the report shows pieces side by side
    assert (run / "bisect.json").is_file() and (run / "report.html").is_file()


def test_report_shows_raw_bytes_as_escapes(probed):
    run, _, _ = probed
    html = (run / "report.html").read_text(encoding="utf-8")
    md = (run / "report.md").read_text(encoding="utf-8")
    assert re.search(r'<span class="esc">\\x[89a-f][0-9a-f]</span>', html)
    assert re.search(r"\\x[89a-f][0-9a-f]", md)
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in html + md)  # no lone surrogate reached a file


@pytest.mark.parametrize("storage", ["pyarrow", "python"])
def test_tables_round_trip_with_and_without_arrow_strings(probed, storage):
    pd = pytest.importorskip("pandas")
    if storage == "pyarrow":
        pytest.importorskip("pyarrow")
    from nondet.reports import read_tables, write_report

    run, _, _ = probed
    with pd.option_context("mode.string_storage", storage):
        tables = read_tables(run)
        assert list(tables.streams.piece) == _pieces(run)  # exact, raw bytes included
        assert tables.runs.text.map(type).eq(str).all()
        write_report(run)


def test_gate_runs_end_to_end(bpe_model_dir, tmp_path):
    (tmp_path / ".git").mkdir()
    r = nondet("gate", "--model", str(bpe_model_dir), "-p", "naïve 北京 🚀", "-b", "1,4", "-n", "16",
               "--inject-variance", "--junit", "junit.xml", "--out", "run", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr  # the control makes the policy fail
    assert "nondet gate: policy violated (identical)" in r.stdout
    assert (tmp_path / "junit.xml").is_file() and (tmp_path / "run" / "report.html").is_file()
    r = nondet("gate", "--model", str(bpe_model_dir), "-p", "naïve 北京 🚀", "-b", "1,4", "-n", "16",
               "--inject-variance", "--kernels", "batch-invariant", "--out", "run2", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr  # and the mode's norm class fixes it
