"""guard_refusal: the kept guard that refused a call, read from torch's message without eval."""

from types import SimpleNamespace

import torch

from nondet.probes.core.guard_refusal import failed_part, listed_parts


def _message(*parts: str) -> str:
    """A refusal as torch words it (torch 2.11-2.13), each part with its `  # where` comment."""
    listed = ", ".join(repr(p + "  # where it came from") for p in parts)
    return f"GuardManager check failed, reason: GuardDebugInfo(\nresult=0,\nverbose_code_parts=[{listed}],\n" \
           f"num_guards_executed=12,\nuser_stack=None)"


def test_a_real_refusal_names_the_part_that_failed_not_the_first_listed():
    """A saved function (torch's AOT compile, as precompiled.py saves steps) traced on a batch of 2 with the batch
    symbolic and a branch on 3, then called with 3. torch lists a relation that held first; the failed part is
    the branch's guard. Control: the first listed part holds on the refused call."""
    from nondet.probes.core.aot_step import aot_compilable, aot_compile

    def step(x, y):
        return x + y if x.shape[0] == 3 else x * y

    x, y = torch.ones(2, 4), torch.ones(2, 4)
    for tensor in (x, y):
        torch._dynamo.maybe_mark_dynamic(tensor, 0)
    compiled = aot_compile(aot_compilable(step, {"backend": "eager", "fullgraph": True}), ((x, y), {}))
    refused = {"x": torch.ones(3, 4), "y": torch.ones(3, 4)}
    try:
        compiled(**refused)
    except RuntimeError as exc:
        message = str(exc)
    else:
        raise AssertionError("the guards took a batch of 3")
    assert failed_part(message, refused) == "L['x'].size()[0] != 3"
    first = listed_parts(message)[0]
    assert first != "L['x'].size()[0] != 3" and failed_part(_message(first), refused) is None  # it held


def test_shapes_strides_and_cache_layers_are_read_and_a_chain_is_every_link():
    mask = torch.ones(1, 1, 1, 46, dtype=torch.bool)
    cache = SimpleNamespace(layers=[SimpleNamespace(keys=torch.zeros(1, 8, 46, 16))])
    frame = {"inputs": {"attention_mask": {"full_attention": mask}, "past_key_values": cache}}
    held = ("L['inputs']['attention_mask']['full_attention'].stride()[0] == "
            "L['inputs']['attention_mask']['full_attention'].size()[3]")
    keys = "L['inputs']['past_key_values'].layers[0].keys.size()[2] == 46 and not 1 > 2"
    failed = "2 <= L['inputs']['attention_mask']['full_attention'].size()[0] <= 2147483647"
    assert failed_part(_message(held, keys, failed), frame) == failed
    assert failed_part(_message(held, keys), frame) is None  # control: every part held
    assert failed_part(_message("(576*L['inputs']['past_key_values'].layers[0].keys.size()[0]) == 576 - 1 % 7"),
                       frame) == "(576*L['inputs']['past_key_values'].layers[0].keys.size()[0]) == 576 - 1 % 7"


def test_a_part_with_any_other_call_is_passed_over_and_never_run():
    fired = []
    frame = {"inputs": {"probe": SimpleNamespace(fire=lambda: fired.append(1) or 0, _hidden=0)}}
    calls = ("L['inputs']['probe'].fire() == 1", "__import__('os').getpid() == 0", "L['inputs']['probe']._hidden == 1",
             "(lambda: 0)() == 1")
    assert failed_part(_message(*calls), frame) is None
    assert fired == []
    assert failed_part(_message(*calls, "1 == 2"), frame) == "1 == 2"  # control: a readable false part is found


def test_the_list_is_read_as_strings_so_quotes_inside_a_part_do_not_cut_it():
    quoted = 'L[\'inputs\'][\'x\'].size()[0] == 1  # if is_active("norm") or rows == 1:  # variant.py:50'
    message = f"GuardManager check failed, reason: GuardDebugInfo(result=0, verbose_code_parts=[{quoted!r}, " \
              f"\"L['inputs']['x'].size()[0] != 5  # y\"], num_guards_executed=3)"
    assert listed_parts(message) == ["L['inputs']['x'].size()[0] == 1", "L['inputs']['x'].size()[0] != 5"]
    assert failed_part(message, {"inputs": {"x": torch.ones(2)}}) == "L['inputs']['x'].size()[0] == 1"
    assert listed_parts("a message without a list") == [] and listed_parts("verbose_code_parts=['cut") == []
