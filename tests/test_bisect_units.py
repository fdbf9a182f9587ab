"""bisect's pieces on their own: bit comparison, op-class classification, target choice,
row alignment of captures, and the ablation's minimal-set search (fake replays)."""

import pytest

from nondet.errors import RunDirError, UsageError


# -- compare ------------------------------------------------------------------------------


def test_compare_bits_ulp_and_first_index():
    import torch

    from nondet.probes.bisect.compare import compare

    a = torch.tensor([1.0, 2.0, 3.0, -4.0], dtype=torch.bfloat16)
    assert not compare(a, a.clone()).differs
    b = a.view(torch.int16).clone()
    b[2] += 1  # 3.0 -> the next bf16 up
    d = compare(a, b.view(torch.bfloat16))
    assert d.differs and d.max_ulp == 1 and d.first_diff_index == 2
    assert d.max_abs_diff == 2.0 ** -6 and d.max_rel_diff == pytest.approx(2.0 ** -6 / (3 + 2.0 ** -6))


def test_compare_signed_zero_and_ulp_across_zero():
    import torch

    from nondet.probes.bisect.compare import compare, ulp_distance

    zeros = compare(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert zeros.differs and zeros.max_ulp == 0 and zeros.first_diff_index == 0
    tiny = torch.tensor([1e-45], dtype=torch.float32)  # the smallest subnormal
    assert ulp_distance(tiny, -tiny) == 2


# -- classify ----------------------------------------------------------------------------


def _classes(model) -> dict[str, str]:
    from nondet.probes.bisect.capture import capture_points

    return {p.module: p.op_class for p, _, _ in capture_points(model)}


@pytest.mark.parametrize("arch", ["qwen3", "llama", "mistral", "gemma"])
def test_classify_decoder_families(arch):
    import transformers

    names = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
             "mistral": ("MistralConfig", "MistralForCausalLM"), "gemma": ("GemmaConfig", "GemmaForCausalLM")}
    config_cls, model_cls = (getattr(transformers, n) for n in names[arch])
    config = config_cls(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    classes = _classes(getattr(transformers, model_cls.__name__)(config))
    expected = {"model.embed_tokens": "embedding", "model.rotary_emb": "rotary",
                "model.layers.0.input_layernorm": "norm", "model.layers.0.self_attn.q_proj": "matmul",
                "model.layers.0.self_attn.core": "attention", "model.layers.0.self_attn.o_proj": "matmul",
                "model.layers.0.mlp.act_fn": "activation", "model.layers.0.mlp.down_proj": "matmul",
                "model.layers.0": "other", "model.norm": "norm", "lm_head": "matmul"}
    assert {k: classes.get(k) for k in expected} == expected


def test_classify_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    classes = _classes(GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2)))
    expected = {"transformer.wte": "embedding", "transformer.wpe": "embedding", "transformer.h.0.ln_1": "norm",
                "transformer.h.0.attn.c_attn": "matmul", "transformer.h.0.attn.core": "attention",
                "transformer.h.0.attn.c_proj": "matmul", "transformer.h.0.mlp.act": "activation",
                "transformer.h.0.mlp.c_proj": "matmul", "transformer.h.0": "other", "transformer.ln_f": "norm"}
    assert {k: classes.get(k) for k in expected} == expected
    assert not any("dropout" in k or k.endswith("drop") for k in classes)  # identities are not captured


def test_unknown_module_is_other():
    import torch

    from nondet.probes.bisect.classify import classify, layer_index

    class Mystery(torch.nn.Module):
        pass

    assert classify("model.layers.2.mystery", Mystery()) == "other"
    assert layer_index("model.layers.2.mystery") == 2 and layer_index("lm_head") is None


# -- capture alignment -----------------------------------------------------------------------


def test_target_row_and_left_padding_alignment():
    import torch

    from nondet.probes.bisect.capture import target_row
    from nondet.probes.bisect.lockstep import _align

    batch = torch.arange(4 * 5 * 3).reshape(4, 5, 3)  # [batch, seq, hidden], 2 pad columns on the left
    row = target_row(batch, 3, 4)
    assert torch.equal(row, batch[3])
    assert torch.equal(target_row(batch[:1], 3, 4), batch[0])  # shared [1, ...] tensors (rotary)
    assert target_row(batch[:2], 3, 4) is None  # cannot be aligned: not captured
    ref = batch[3, 2:].clone()
    assert torch.equal(_align(row, ref), ref)  # the target's real tokens are the last ones


# -- choose ------------------------------------------------------------------------------


def _summary(runs):
    return {"modes": {"default": {"reference_run_id": 0, "runs": runs}}}


def _run(run_id, cid, pos, flip, numeric):
    return {"run_id": run_id, "condition_id": cid, "position": pos, "first_token_divergence": flip,
            "first_numeric_divergence": numeric}


CONDITIONS = [{"condition_id": f"default/bs{b}/ends", "kernels": "default", "batch_size": b,
               "positions": [0, b - 1], "fillers": "same-length"} for b in (2, 8, 16)]


def test_choose_earliest_flip_then_condition_and_position():
    from nondet.probes.bisect.choose import choose_target

    runs = [_run(0, "default/bs1/ref", 0, None, None), _run(1, "default/bs2/ends", 0, None, 4),
            _run(2, "default/bs8/ends", 7, 93, 0), _run(3, "default/bs16/ends", 15, 93, 0),
            _run(4, "default/bs16/ends", 0, 120, 0)]
    t = choose_target(CONDITIONS, _summary(runs), "RUN")
    assert (t.condition.condition_id, t.position, t.run_id, t.probe_flip_step) == ("default/bs8/ends", 7, 2, 93)
    t = choose_target(CONDITIONS, _summary(runs), "RUN", "bs16/ends", 0)
    assert (t.condition.batch_size, t.position, t.run_id) == (16, 0, 4)
    with pytest.raises(UsageError, match="did not diverge"):
        choose_target(CONDITIONS, _summary([_run(1, "default/bs2/ends", 0, None, None)] + runs[2:]), "RUN",
                      "bs2/ends")
    with pytest.raises(UsageError, match=r"--position 3: no divergent run at that row; divergent rows: 0, 15, 7"):
        choose_target(CONDITIONS, _summary(runs), "RUN", None, 3)


def test_choose_several_prompts_takes_the_runs_own_reference():
    from nondet.probes.bisect.choose import choose_target

    conditions = [{"condition_id": f"default/p{k}/bs2/ends", "kernels": "default", "batch_size": 2,
                   "positions": [0, 1], "fillers": "copies", "prompt_id": k} for k in (0, 1)]
    runs = [{**_run(3, "default/p0/bs2/ends", 0, None, 4), "prompt_id": 0},
            {**_run(8, "default/p1/bs2/ends", 1, 9, 4), "prompt_id": 1}]
    summary = {"modes": {"default": {"reference_run_id": 0, "runs": runs,
                                     "prompts": [{"prompt_id": 0, "reference_run_id": 0},
                                                 {"prompt_id": 1, "reference_run_id": 5}]}}}
    t = choose_target(conditions, summary, "RUN")
    assert (t.run_id, t.prompt_id, t.reference_run_id) == (8, 1, 5)


def test_choose_nothing_divergent():
    from nondet.probes.bisect.choose import choose_target

    from nondet.errors import NothingToBisect

    with pytest.raises(NothingToBisect, match="no condition diverged"):
        choose_target(CONDITIONS, _summary([_run(0, "default/bs1/ref", 0, None, None)]), "RUN")


# -- ablation minimal set ----------------------------------------------------------------------


class _Fake:
    """A Lockstep stand-in: the classes that still differ decide what differs first."""

    def __init__(self, variant: list[str], ablated: tuple[str, ...]):
        left = [c for c in variant if c not in ablated]
        self.reference = [{"token": 1}] * 5
        self.divergent = [{"token": 1}] * 4 + [{"token": 1 if not left else 2}]
        self.first_diff = None if not left else {"step": 0, "order": variant.index(left[0]), "module": left[0],
                                                 "op_class": left[0], "layer": 0}
        self.flip_step = None if not left else 4
        self.first_numeric_step = None if not left else 0
        self.lasting = self.first_diff
        self.steps = 5


@pytest.mark.parametrize("variant, minimal", [(["matmul"], ["matmul"]),
                                              (["attention", "matmul"], ["attention", "matmul"]),
                                              (["rotary"], None)])
def test_minimal_set(variant, minimal):
    from nondet.probes.bisect.ablation import run_ablation

    classes = ("matmul", "norm", "attention", "softmax")
    origin = {"step": 0, "order": 0, "op_class": variant[0]}
    result = run_ablation(lambda ops: _Fake(variant, ops), classes, origin)
    assert result.minimal_set == minimal
    assert [e["ops"] for e in result.entries][:5] == [[c] for c in classes] + [list(classes)]
    own = next((e for e in result.entries if e["ops"] == [variant[0]]), None)
    assert own is None or own["origin_removed"]


def test_choose_skips_continuous_load():
    from nondet.probes.bisect.choose import choose_target

    conditions = CONDITIONS + [{"condition_id": "default/cb/run1", "kernels": "default", "batch_size": 1,
                                "positions": [0], "fillers": "none", "load": "continuous"}]
    runs = [_run(1, "default/cb/run1", 0, 5, 0), _run(2, "default/bs8/ends", 7, 93, 0)]
    assert choose_target(conditions, _summary(runs), "RUN").run_id == 2
    with pytest.raises(RunDirError, match="only continuous conditions diverged; bisect replays static batches"):
        choose_target(conditions, _summary(runs[:1]), "RUN")


# -- transient or lasting (lasting.py) -----------------------------------------------------------


def _step(*differing: str, modules: tuple[str, ...] | None = None) -> list[dict]:
    """One step's records of a 2-layer decoder, in execution order; `differing` name the points that differ."""
    names = modules or ("model.embed_tokens", "model.rotary_emb") + tuple(
        f"model.layers.{i}.{n}" for i in (0, 1) for n in (
            "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.core",
            "self_attn.o_proj", "mlp.down_proj")) + ("model.norm", "lm_head")
    blocks = [i for i, n in enumerate(names) if n.endswith("mlp.down_proj")]  # each layer's output follows it
    records, order = [], 0
    for i, name in enumerate(names):
        records.append(_record(order, name, name in differing, block=False))
        order += 1
        if i in blocks:
            layer = name.split(".")[2]
            records.append(_record(order, f"model.layers.{layer}", f"model.layers.{layer}" in differing, block=True))
            order += 1
    return records


def _record(order: int, module: str, differs: bool, block: bool) -> dict:
    from nondet.probes.bisect.classify import layer_index

    op = "rotary" if "rotary" in module else "attention" if module.endswith(".core") else "other" if block else "x"
    return {"step": 3, "order": order, "module": module, "op_class": op, "layer": layer_index(module),
            "max_abs_diff": float(differs), "max_ulp": int(differs), "first_diff_index": 0 if differs else None,
            "differs": differs, "block": block}


def test_absorbed_difference_is_transient():
    from nondet.probes.bisect.lasting import judge

    v = judge(3, _step("model.layers.0.mlp.down_proj"))
    assert not v.carries and v.reach == "layer" and v.first["module"] == "model.layers.0.mlp.down_proj"
    v = judge(3, _step("model.layers.1.mlp.down_proj", "model.layers.1"))  # the last layer feeds no cache
    assert not v.carries and v.reach == "residual stream"
    assert judge(3, _step()).first is None


def test_lasting_origin_is_traced_past_an_absorbed_point():
    """Layer 0's difference is absorbed (its output identical); layer 1's key projection starts anew."""
    from nondet.probes.bisect.lasting import judge

    v = judge(3, _step("model.layers.0.mlp.down_proj", "model.layers.1.self_attn.k_proj",
                       "model.layers.1.self_attn.core", "model.layers.1", "lm_head"))
    assert v.carries and v.reach == "kv cache"
    assert v.first["module"] == "model.layers.0.mlp.down_proj"
    assert v.origin["module"] == v.enters["module"] == "model.layers.1.self_attn.k_proj"
    v = judge(3, _step("model.layers.0.mlp.down_proj", "model.layers.0", "model.layers.1.input_layernorm",
                       "model.layers.1.self_attn.v_proj"))  # not absorbed: the origin is layer 0's
    assert v.origin["module"] == "model.layers.0.mlp.down_proj"
    assert v.enters["module"] == "model.layers.1.self_attn.v_proj"


def test_query_only_difference_reaches_the_logits_not_the_cache():
    from nondet.probes.bisect.lasting import Tracker, judge

    records = _step("model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.core", "model.layers.1", "lm_head")
    v = judge(3, records)
    assert not v.carries and v.reach == "logits" and v.origin["module"] == "model.layers.1.self_attn.q_proj"
    kept = Tracker()
    kept.add(v, flip=False)
    assert kept.lasting is None and [t["reach"] for t in kept.transients] == ["logits"]
    kept.add(v, flip=True)  # the same difference at the flip: born there, via the logits
    assert kept.result()["via"] == "logits" and kept.result()["module"] == "model.layers.1.self_attn.q_proj"


def test_rotary_is_a_cache_input_and_unknown_attention_is_conservative():
    from nondet.probes.bisect.lasting import Tracker, judge

    assert judge(3, _step("model.rotary_emb")).carries
    no_core = _step("mlp.fc", modules=("embed", "mlp.fc", "lm_head"))
    v = judge(3, no_core)
    assert v.carries and v.origin["module"] == "mlp.fc"
    t = Tracker()
    for step in (v, judge(4, _step()), v):
        t.add(step, flip=False)
    assert t.result()["silent_steps"] == 1 and t.transients == []


def _tp_stream(run_id: int, condition_id: str, logprob: float, reference: bool = False) -> dict:
    steps = [{"token": 5, "logprob": -0.5}, {"token": 6, "logprob": logprob}]
    return {"run_id": run_id, "condition_id": condition_id, "kernels": "default", "tp": 2, "position": 0,
            "tp_reference": reference, "steps": steps}


def test_tp_choice_of_an_invariant_run_is_nothing_to_bisect_and_a_flag_that_picks_nothing_is_usage():
    """A TP run whose every condition matches the prompt alone at its degree is NothingToBisect (exit 0 in the
    CLI); --condition naming a run that matched is a usage error. Control: one run's last logprob moved is
    chosen, with its step."""
    from nondet.errors import NothingToBisect, UsageError
    from nondet.probes.tp.bisect import choose_tp_target

    conditions = [{"condition_id": "tp2/bs1/ref", "kernels": "default", "batch_size": 1, "positions": [0],
                   "fillers": "none"},
                  {"condition_id": "tp2/bs4/first", "kernels": "default", "batch_size": 4, "positions": [0],
                   "fillers": "same-length"}]
    same = [_tp_stream(0, "tp2/bs1/ref", -1.25, reference=True), _tp_stream(1, "tp2/bs4/first", -1.25)]
    with pytest.raises(NothingToBisect, match="no run diverged"):
        choose_tp_target(conditions, same, "RUN")
    with pytest.raises(UsageError, match="--condition / --position as given"):
        choose_tp_target(conditions, same, "RUN", wanted="bs4/first")
    moved = [same[0], _tp_stream(1, "tp2/bs4/first", -1.5)]
    target, degree = choose_tp_target(conditions, moved, "RUN")
    assert (target.run_id, target.probe_numeric_step, target.probe_flip_step, degree) == (1, 1, None, 2)
