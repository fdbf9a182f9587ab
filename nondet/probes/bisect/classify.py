"""Module -> op class, from module types and names (Qwen3, Llama, Mistral, Gemma, GPT-2).

The classes are the ones a kernel can be blamed for: embedding, norm, matmul, attention
(the attention core: the SDPA / flash / eager function, captured as its own point, see
capture.py), softmax, rotary, activation, router and experts (a mixture of experts' routing
decision and its expert matmuls), collective (under tensor parallelism: the
all-reduce after a row-parallel linear, a point named "<linear>.all_reduce", see
probes/tp/collective.py), and "other" for whatever we do not recognise: an unknown module
is reported as "other", never guessed. Decoder-layer outputs (the
residual stream) are "other" too: the residual add is elementwise and batch-invariant.
"""

import re

OP_CLASSES = ("embedding", "norm", "matmul", "attention", "softmax", "rotary", "activation", "router", "experts",
              "collective", "other")
ABLATABLE = ("matmul", "norm", "attention", "softmax")  # what nondet.kernels can make invariant on any model
MOE_ABLATABLE = ("experts", "router")  # and on a mixture-of-experts model

_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)(?:\.|$)")
_BLOCK = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.\d+$")
_OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "c_proj", "dense", "wo")  # attention output projections
COLLECTIVE_SUFFIX = ".all_reduce"  # a row-parallel linear's all-reduce: "<linear path>.all_reduce"
_SKIPPED_TYPES = ("Dropout", "Identity")  # identities in eval mode: capturing them only duplicates


def classify(path: str, module) -> str:
    """The op class of one captured module (a leaf, or a decoder layer -> "other")."""
    if path.endswith(COLLECTIVE_SUFFIX):
        return "collective"
    kind = type(module).__name__
    origin = type(module).__module__
    if "Router" in kind:  # the MoE router: linear + softmax/sigmoid + top-k (Qwen3MoeTopKRouter, ...)
        return "router"
    if kind.endswith("Experts"):  # the MoE experts (Qwen3MoeExperts, GptOssExperts, ...)
        return "experts"
    if "Rotary" in kind:
        return "rotary"
    if "Embedding" in kind:
        return "embedding"
    if kind.endswith(("Norm", "LayerNorm", "RMSNorm")) or kind in ("LayerNorm", "GroupNorm"):
        return "norm"
    if kind in ("Linear", "Conv1D", "Conv1d") or kind.endswith("Linear"):
        return "matmul"
    if kind in ("Softmax", "LogSoftmax", "Softmax2d"):
        return "softmax"
    if origin in ("transformers.activations", "torch.nn.modules.activation"):
        return "activation"
    return "other"


def ablatable(model) -> tuple[str, ...]:
    """The op classes bisect's ablation tries on this model: the MoE classes only where they exist."""
    moe = any(classify(path, m) in MOE_ABLATABLE for path, m in model.named_modules())
    return ABLATABLE + (MOE_ABLATABLE if moe else ())


def layer_index(path: str) -> int | None:
    """'model.layers.3.mlp.up_proj' -> 3; None outside the decoder layers."""
    match = _LAYER.search(path)
    return int(match.group(1)) if match else None


def is_block(path: str) -> bool:
    """A decoder layer itself ('model.layers.3', 'transformer.h.3'): its output is the residual stream."""
    return bool(_BLOCK.search(path))


def is_skipped(module) -> bool:
    return type(module).__name__ in _SKIPPED_TYPES


def output_projection(path: str, module) -> str | None:
    """The child of an attention module whose INPUT is the attention core's output, or None."""
    if "Attention" not in type(module).__name__:
        return None
    children = dict(module.named_children())
    for name in _OUTPUT_PROJECTIONS:
        if name in children and classify(f"{path}.{name}", children[name]) == "matmul":
            return name
    return None
