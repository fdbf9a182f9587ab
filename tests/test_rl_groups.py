"""GRPO sample groups in `nondet rl`: a group whose samples are all identical is flagged (summary,
terminal, report); one whose samples differ is not; a prompt sampled once is no group.

The bug this catches: every request of a group got one default seed (SGLang issue 15481), so all
samples of a prompt came out the same and GRPO's advantage was 0 for the group."""

import json
from io import StringIO

import pytest

from nondet.probes.models.loading import ModelSpec
from nondet.rl.config import SAMPLER_RULES, RLConfig, sampler_kind
from nondet.rl.groups import sample_groups, warning
from nondet.rl.run import run_rl
import cli_runner

GROUP_PROMPT = [5, 6, 7, 8]  # token ids of the tiny model's 512-token vocabulary
OTHER_PROMPT = [9, 10]


def stream(prompt_id, prompt_ids, tokens, kernels="external", side="sampler"):
    """A sampler stream as read back from streams.jsonl (extras flattened), only the fields groups read."""
    return {"prompt_id": prompt_id, "kernels": kernels, "side": side, "prompt_ids": list(prompt_ids),
            "steps": [{"token": t, "logprob": "-0x1.0p-1"} for t in tokens]}


# -- the pure function ------------------------------------------------------------------------------------


def test_identical_group_is_flagged_and_a_single_prompt_is_no_group():
    streams = [stream(i, GROUP_PROMPT, [1, 2, 3]) for i in range(3)] + [stream(3, OTHER_PROMPT, [4])]
    doc = sample_groups(streams)
    assert doc["identical_groups"] == 1
    (g,) = doc["groups"]  # OTHER_PROMPT was sampled once: not a group
    assert g == {"kernels": "external", "prompt": "token ids [5, 6, 7, 8]", "prompt_ids": [0, 1, 2], "size": 3,
                 "distinct": 1, "identical": True}


def test_differing_group_is_not_flagged():
    streams = [stream(i, GROUP_PROMPT, tokens) for i, tokens in enumerate(([1, 2, 3], [1, 2, 4], [1, 2, 3]))]
    doc = sample_groups(streams)
    assert doc["identical_groups"] == 0
    assert [(g["size"], g["distinct"], g["identical"]) for g in doc["groups"]] == [(3, 2, False)]
    assert warning({"sample_groups": doc}) is None


def test_groups_are_per_kernels_mode_and_sampler_side_only():
    streams = [stream(0, GROUP_PROMPT, [1], kernels="default"), stream(1, GROUP_PROMPT, [1], kernels="batch-invariant"),
               stream(0, GROUP_PROMPT, [1], kernels="default", side="trainer")]
    assert sample_groups(streams) == {"groups": [], "identical_groups": 0}


def test_prompt_label_is_the_text_or_a_chat_or_the_first_token_ids():
    long = "x" * 100
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    streams = [stream(i, [1, 2], [3]) for i in range(2)] + [stream(i, [4], [5]) for i in (2, 3)]
    streams += [stream(i, list(range(40)), [6]) for i in (4, 5)]
    labels = [g["prompt"] for g in sample_groups(streams, (long, long, chat, chat))["groups"]]
    assert labels[0] == "x" * 60 and labels[1] == "user: hi"
    assert labels[2].startswith("token ids [0, 1, 2") and labels[2].endswith("...]")


def test_warning_line_names_the_count_an_example_and_the_cause():
    groups = [stream(i, GROUP_PROMPT, [1]) for i in range(4)] + [stream(i, OTHER_PROMPT, [i]) for i in (4, 5)]
    rl = {"sample_groups": sample_groups(groups), "processing": {"top_k": 0}}
    assert warning(rl) == ("1 of 2 sample groups: every sample identical (4 samples of one prompt gave 1 completion); "
                           "the requests likely share one seed; GRPO's advantage is 0 for such a group")
    assert "--top-k 1 is greedy" in warning({**rl, "processing": {"top_k": 1}})


# -- nondet rl on the tiny model --------------------------------------------------------------------------


def write_rollouts(path, completions) -> str:
    """Four rollouts of GROUP_PROMPT with the given completions, and one of OTHER_PROMPT (no group)."""
    rows = [(GROUP_PROMPT, c) for c in completions] + [(OTHER_PROMPT, [30, 31])]
    path.write_text("".join(json.dumps({"prompt_ids": p, "completion_ids": c, "logprobs": [-0.5] * len(c)}) + "\n"
                            for p, c in rows))
    return str(path)


def config(model_dir, out, **kw) -> RLConfig:
    base = dict(model=ModelSpec(name=str(model_dir)), max_new_tokens=4, sampler_batch=4, micro_batches=(4,),
                backward=False, exact_kl=False, out=str(out))
    kind = sampler_kind(RLConfig(**kw))  # rl/config.py refuses a sampler-side setting its sampler does not read
    base = {k: v for k, v in base.items() if all(k != path or kind in readers for _, path, readers in SAMPLER_RULES)}
    return RLConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def identical_run(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("groups")
    path = write_rollouts(tmp / "rollouts.jsonl", [[20, 21, 22]] * 4)
    return run_rl(config(tiny_model_dir, tmp / "run", rollouts=path))


def test_rollouts_positive_control_identical_group_in_summary(identical_run):
    doc = identical_run.summary["rl"]["sample_groups"]
    assert doc["identical_groups"] == 1
    (g,) = doc["groups"]
    assert (g["kernels"], g["size"], g["distinct"], g["prompt_ids"]) == ("external", 4, 1, [0, 1, 2, 3])
    on_disk = json.loads((identical_run.run_dir / "summary.json").read_text())
    assert on_disk["rl"]["sample_groups"] == doc


def test_rollouts_negative_control_differing_group_is_not_flagged(tiny_model_dir, tmp_path):
    path = write_rollouts(tmp_path / "rollouts.jsonl", [[20, 21, 22], [20, 21, 23], [24], [20, 21, 22]])
    result = run_rl(config(tiny_model_dir, tmp_path / "run", rollouts=path))
    doc = result.summary["rl"]["sample_groups"]
    assert doc["identical_groups"] == 0
    assert [(g["size"], g["distinct"]) for g in doc["groups"]] == [(4, 3)]
    from nondet.reports import write_report

    md, _ = write_report(result.run_dir)
    assert "Identical sample groups" not in md.read_text()


def test_report_shows_the_identical_groups(identical_run, tmp_path):
    from nondet.reports import write_report

    md, _ = write_report(identical_run.run_dir)
    text = md.read_text()
    assert "## Identical sample groups" in text
    assert "1 of 1 sample groups: every sample identical (4 samples of one prompt" in text
    assert "| `external` | `token ids [5, 6, 7, 8]` | 4 | 0, 1, 2, 3 |" in text  # prompt: model-side text, escaped


def test_in_process_repeated_prompt_differs_by_seed_but_greedy_is_flagged(tiny_model_dir, tmp_path):
    """A prompt repeated in --prompts is a group; each request has its own seed, so samples differ;
    top-k 1 is greedy, so they cannot, and the line says so instead of blaming a seed."""
    prompts = ("Hello there",) * 3 + ("Tell me about Richard Feynman",)
    sampled = run_rl(config(tiny_model_dir, tmp_path / "sampled", prompts=prompts)).summary["rl"]
    assert [(g["kernels"], g["prompt"], g["size"]) for g in sampled["sample_groups"]["groups"]] == [
        ("default", "Hello there", 3)]
    assert sampled["sample_groups"]["identical_groups"] == 0
    greedy = run_rl(config(tiny_model_dir, tmp_path / "greedy", prompts=prompts, top_k=1)).summary["rl"]
    assert greedy["sample_groups"]["identical_groups"] == 1 and "--top-k 1 is greedy" in warning(greedy)


def test_terminal_prints_nothing_when_no_group_is_identical():
    from rich.console import Console

    from nondet.cli.rl import _print_groups_warning

    buf = StringIO()
    _print_groups_warning(Console(file=buf, width=200), {"sample_groups": {"groups": [], "identical_groups": 0}})
    assert buf.getvalue() == ""


def test_cli_prints_the_warning_line(tiny_model_dir, tmp_path):
    path = write_rollouts(tmp_path / "rollouts.jsonl", [[20, 21, 22]] * 4)
    proc = cli_runner.run(["rl", "--model", str(tiny_model_dir), "--rollouts", path, "--micro-batch", "4",
                           "--no-backward", "--out", str(tmp_path / "run")], timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())  # rich wraps the line at the terminal's width
    assert ("warning: 1 of 1 sample groups: every sample identical (4 samples of one prompt gave 1 completion); "
            "the requests likely share one seed; GRPO's advantage is 0 for such a group") in out
