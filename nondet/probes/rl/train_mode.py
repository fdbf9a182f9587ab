"""The trainer's forward: train mode, as trainers run it, with nothing random left in it.

The trainer recomputes the sampled tokens' logprobs with `model.train()` (trainer.py: the code
paths a training step takes), and its logprobs must be a function of the tokens and the kernels
alone: random noise would read as sampler-vs-trainer variance ("off-policy"), also under the
batch-invariant mode. Models switch randomness on in train mode under many names, not only in
nn.Dropout modules: floats a module keeps (gpt_bigcode's `attn_dropout` = config.attn_pdrop, OPT's
`layerdrop`), config fields read inside forward (Falcon's `config.hidden_dropout`), code under
`self.training` (Mixtral's router jitter, PhiMoE's Gumbel-sampled routing). So, in `training`:

  1. every number named like a drop rate (`*drop*`: dropout, pdrop, layerdrop, drop_path) on every
     module and on every config the modules hold is 0, restored after. A drop rate only ever draws
     random masks, so 0 changes nothing else. Jitter fields are NOT zeroed by name: PhiMoE's
     `router_jitter_noise` is also the routing threshold its eval forward uses.
  2. what is still random is found by running one short sequence twice, from two RNG states: the
     first module to finish whose inputs agree and whose outputs differ is where the randomness
     starts. Every module of its class then runs its own code in eval mode (its children stay in
     train mode): the model's own random-free forward, the one the sampler computes. Repeated until
     two forwards agree bit for bit.
  3. where they never do (randomness that eval mode keeps), the model is refused in one line naming
     the module (UnsupportedModelError, exit 3), rather than its noise reported as variance.

A module that keeps a LayerDrop rate (`layerdrop`: OPT's decoder) runs its own code in eval mode
too, its layers in train mode. transformers 5.17 draws LayerDrop's number in train mode whatever
the rate (OPT: `if self.training: torch.rand([])` per layer; 5.24 only above rate 0); at rate 0 `rand < 0` never
skips a layer, so the bits are train mode's, but the draw is an aten::rand the mode's op census
refuses. OPT's decoder reads `self.training` for LayerDrop alone (some versions also to warn that
gradient checkpointing drops the cache), and a dropout an owner applies itself has rate 0 here, as in
eval mode: eval mode there leaves the same computation without the draw.

The modules found are kept per model object, so every trainer condition and bisect replay takes
them without running the search again.
"""

import contextlib
import itertools
import weakref
from dataclasses import dataclass, field

from nondet.errors import UnsupportedModelError

ROUNDS = 8  # module classes switched to eval mode, at most, before the model is refused
PROBE_LEN = 8  # tokens of the sequence the search runs
_QUIET = weakref.WeakKeyDictionary()  # model -> names of its modules that run in eval mode


@contextlib.contextmanager
def training(model, ids: list[int] | None = None):
    """model.train() without randomness, restored after. ids: the search's sequence, the first time a
    model enters (default: a few ids spread over the vocabulary)."""
    quiet = _QUIET.get(model)
    if quiet is None:
        quiet = _QUIET[model] = settle(model, list(ids or spread_ids(model)))
    with train_mode(model, quiet):
        yield


@contextlib.contextmanager
def train_mode(model, quiet: tuple[str, ...] = ()):
    """model.train() with every drop rate 0 and the `quiet` modules' own code in eval mode."""
    was_training = model.training
    saved = zero_drop_rates(model)
    model.train()
    for name in (*quiet, *layerdrop_owners(model)):
        model.get_submodule(name).training = False  # this module's code only; train() set its children
    try:
        yield
    finally:
        model.train(was_training)
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def zero_drop_rates(model) -> list[tuple[object, str, object]]:
    """Set every nonzero number named like a drop rate to 0, on the modules and their configs; what was set."""
    saved = []
    for owner in [*model.modules(), *configs(model)]:
        for name, value in list(vars(owner).items()):
            if _is_rate(value) and ("drop" in name.lower() or (name == "p" and _is_dropout(owner))):
                saved.append((owner, name, value))
                setattr(owner, name, type(value)(0))
    return saved


def layerdrop_owners(model) -> tuple[str, ...]:
    """Modules that keep a LayerDrop rate (zeroed by zero_drop_rates): their own code runs in eval mode, so
    no LayerDrop number is drawn (the module docstring says why that is train mode's computation)."""
    return tuple(name for name, module in model.named_modules() if "layerdrop" in vars(module))


def configs(model) -> list:
    """Every transformers config the modules hold, sub-configs (text_config, ...) included, once each."""
    from transformers import PretrainedConfig

    found, todo = {}, [getattr(m, "config", None) for m in model.modules()]
    while todo:
        c = todo.pop()
        if isinstance(c, PretrainedConfig) and id(c) not in found:
            found[id(c)] = c
            todo += [v for v in vars(c).values() if isinstance(v, PretrainedConfig)]
    return list(found.values())


def _is_rate(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0


def _is_dropout(module) -> bool:
    return "dropout" in type(module).__name__.lower()  # nn.Dropout and its kin keep their rate in `p`


def settle(model, ids: list[int]) -> tuple[str, ...]:
    """The modules that must run in eval mode for two train-mode forwards to agree bit for bit."""
    quiet: tuple[str, ...] = ()
    for _ in range(ROUNDS):
        with train_mode(model, quiet):
            origin = random_origin(model, ids)
        if origin is None:
            return quiet
        if origin in quiet:  # eval mode did not make it deterministic
            break
        quiet += same_class(model, origin)
    where = f"{origin or 'the model'} ({type(model.get_submodule(origin)).__name__})"
    raise UnsupportedModelError(
        f"the trainer's forward of {type(model).__name__} stays random in train mode: {where} gives other bits "
        f"from another RNG state with every drop rate at 0 and {'itself' if origin in quiet else 'the modules found'} "
        "in eval mode; nondet rl cannot tell that noise from batch variance")


def same_class(model, name: str) -> tuple[str, ...]:
    """Every module of the class of module `name`: one class runs one code, so the same randomness."""
    cls = type(model.get_submodule(name))
    return tuple(n for n, m in model.named_modules() if type(m) is cls)


def random_origin(model, ids: list[int]) -> str | None:
    """The module where randomness starts in a train-mode forward of `ids`, or None where there is none."""
    first, second = trace(model, ids, seed=0), trace(model, ids, seed=1)
    if same_calls(first, second):
        return None
    if not same_calls(first, trace(model, ids, seed=0)):
        return None  # the kernels differ run to run, RNG aside: not randomness that eval mode could switch off
    return first_origin(first, second)


@dataclass
class Call:
    name: str
    inputs: list  # tensors of args and kwargs, as the module got them (copied before it ran)
    outputs: list = field(default_factory=list)
    finished: int = -1  # rank among the calls by when the module returned: children before parents


def trace(model, ids: list[int], seed: int) -> list[Call]:
    """Every module call of one train-mode forward of `ids` (no grad), the global RNG seeded `seed`."""
    import torch

    names = {m: n for n, m in model.named_modules()}
    calls, open_calls, finishing = [], [], itertools.count()

    def before(module, args, kwargs):
        calls.append(Call(names[module], tensors((args, kwargs))))  # copied now: forwards change inputs in place
        open_calls.append(calls[-1])

    def after(module, args, kwargs, output):
        call = open_calls.pop()
        call.outputs, call.finished = tensors(output), next(finishing)

    handles = [h for m in names for h in (m.register_forward_pre_hook(before, with_kwargs=True),
                                          m.register_forward_hook(after, with_kwargs=True))]
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})  # the model's GPUs
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():  # the run's own RNG state untouched
            torch.default_generator.manual_seed(seed)
            for index in devices:  # only the generators fork_rng restores
                torch.cuda.default_generators[index].manual_seed(seed)
            model(input_ids=torch.tensor([ids], device=model.device),
                  position_ids=torch.arange(len(ids), device=model.device)[None], use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return calls


def tensors(obj) -> list:
    """The tensors in nested tuples, lists and dicts (ModelOutput too), copied."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj.detach().clone()]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in tensors(item)]
    return []


def same_bits(a: list, b: list) -> bool:
    """Bits, not values: NaN agrees with the same NaN, -0.0 differs from 0.0."""
    import torch

    def raw(t):
        return t.contiguous().view(-1).view(torch.uint8)

    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(raw(x), raw(y))
                                    for x, y in zip(a, b))


def same_calls(a: list[Call], b: list[Call]) -> bool:
    return len(a) == len(b) and all(x.name == y.name and same_bits(x.outputs, y.outputs) for x, y in zip(a, b))


def first_origin(first: list[Call], second: list[Call]) -> str:
    """The first module to finish whose inputs agree and outputs differ (inner before outer), else the
    first call that is not the same module in both (a module run at random)."""
    pairs = sorted(zip(first, second), key=lambda p: p[0].finished)
    for x, y in pairs:
        if x.name == y.name and same_bits(x.inputs, y.inputs) and not same_bits(x.outputs, y.outputs):
            return x.name
    return next((x.name for x, y in zip(first, second) if x.name != y.name), "")


def spread_ids(model) -> list[int]:
    """PROBE_LEN token ids spread over the vocabulary (distinct tokens, away from the special ids at 0..2)."""
    vocab = model.get_input_embeddings().num_embeddings
    return [(3 + 37 * i) % vocab for i in range(PROBE_LEN)]
