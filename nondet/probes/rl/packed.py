"""Packed sequences on the RL trainer side: several sequences in one row, as trainers pack them.

    row:       [ p0 c0 ......... | p1 c1 ...... | p2 c2 .... ]     one micro-batch, no padding
    positions: [ 0 1 2 ... n0-1  | 0 1 ... n1-1 | 0 1 ...    ]     restart per sequence

transformers (5.x masking_utils) reads packing from position ids when no attention mask is
given and builds a block-diagonal causal mask, so SDPA and eager keep attention within each
sequence. That is the default kernels' path here, unchanged. Under the mode the same mask
reaches the invariant attention (kernels/hf.py registers SDPA's mask builder for it), which
cuts the row back into its sequences (kernels/packed.py), so a packed sequence gets the bits
of its own decode (tests/test_rl.py; on an H100 the uncut row gave 80-87% bit-identical
logprobs at micro-batch 4-8, docs/benchmarks.md).

Not every model takes that mask: BLOOM's ALiBi, OPT (positions counted from the mask), GPT-OSS
(sliding layers, sinks), recurrent layers (Jamba, Qwen3-Next) and Falcon under transformers 5.17
let a packed sequence see the ones before it, under either kernels. So before the trainer runs
packed micro-batches, `refuse_leaky_packing` checks on the loaded model that a packed row keeps two
short sequences apart (and, under the mode, gives the 2nd one its bits alone), and refuses
`--padding packed` in one line where it does not.
"""


def packed(rows: list[tuple[int, ...]]) -> tuple[list, list, list[tuple[int, int]]]:
    """(ids [1, total], position ids [1, total], (row 0, offset) of each sequence) of one packed row."""
    ids, positions, places = [], [], []
    for r in rows:
        places.append((0, len(ids)))
        ids += list(r)
        positions += list(range(len(r)))
    return [ids], [positions], places


def refuse_leaky_packing(model, tokens: list[int], modes: tuple[str, ...]) -> None:
    """UsageError (exit 2) where a packed row of two sequences lets the 2nd see the 1st, under any of the run's
    kernels modes (called in the trainer's train mode; tokens: 12 ids to build the two sequences of)."""
    from nondet.errors import UsageError
    from nondet.probes.core.kernels_mode import kernels_mode

    first, second = list(tokens[:5]), list(tokens[5:12])
    for mode in modes:
        with kernels_mode(mode, model):
            problem = leak(model, first, second) or (mode == "batch-invariant" and not_as_alone(model, first, second))
        if problem:
            raise UsageError(f"--padding packed: {type(model).__name__} {problem}, so a packed micro-batch would "
                             "measure that, not batch variance; pass --padding right")


def leak(model, first: list[int], second: list[int]) -> str | None:
    """Whether the 2nd sequence's logits depend on the 1st one's tokens: the gradient of their sum with respect
    to the 1st sequence's input embeddings. Exactly 0 where each sequence attends only to itself, whatever the
    kernels and dtype (a masked key's probability is exactly 0, and so is all that flows back through it),
    so no tolerance is needed to tell a leak from rounding; any other value is a leak."""
    import torch

    ids, positions, _ = packed([first, second])
    leaves = []

    def as_leaf(module, args, output):  # the embeddings as a leaf the gradient is taken at
        leaves.append(output.detach().requires_grad_())
        return leaves[-1]

    hook = model.get_input_embeddings().register_forward_hook(as_leaf)
    try:
        with torch.enable_grad():
            logits = forward(model, ids, positions)[0, len(first):]
            (grad,) = torch.autograd.grad(logits.float().sum(), leaves[0])
    finally:
        hook.remove()
    if bool(grad[0, :len(first)].ne(0).any()):
        return "lets a packed sequence see the one before it (its logits depend on the earlier sequence's tokens)"
    return None


def not_as_alone(model, first: list[int], second: list[int]) -> str | None:
    """Under the mode a packed sequence must get the bits it gets alone (what the mode's packed attention is for)."""
    import torch

    with torch.enable_grad():  # the trainer's forward takes autograd's path
        row = forward(model, *packed([first, second])[:2])[0, len(first):]
        alone = forward(model, [second], [list(range(len(second)))])[0]
    if torch.equal(row, alone):
        return None
    diff = float((row.float() - alone.float()).abs().max())
    return (f"does not give a packed sequence the bits it gets alone under --kernels batch-invariant "
            f"(max |logit diff| {diff:.3g})")


def forward(model, ids: list, positions: list):
    """The trainer's packed forward: no attention mask, position ids restarting per sequence, no cache."""
    import torch

    device = model.device
    return model(input_ids=torch.tensor(ids, device=device), position_ids=torch.tensor(positions, device=device),
                 use_cache=False).logits
