"""`--tp 2` / `--tp 1,2` -> the degrees, and the checks made before a worker starts.

The smallest degree asked holds the reference (the prompt alone at batch size 1); every
stream of every degree is compared with it, so the TP1-vs-TPN difference is a diff like any other.
"""

from nondet.errors import UsageError


def parse_tp(text: str) -> tuple[int, ...]:
    """'2' or '1,2' -> (2,) / (1, 2): sorted, unique, each >= 1."""
    degrees: set[int] = set()
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        try:
            degrees.add(int(part))
        except ValueError:
            raise UsageError(f"--tp: {part!r} is not an integer; pass degrees like 2 or 1,2") from None
    if not degrees or min(degrees) < 1:
        raise UsageError("--tp: every tensor-parallel degree must be an integer >= 1, e.g. --tp 1,2")
    return tuple(sorted(degrees))


def check_heads(model_config, degrees: tuple[int, ...]) -> None:
    """Attention heads (and KV heads) must split evenly over the ranks of every degree."""
    heads = getattr(model_config, "num_attention_heads", None)
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    for n in degrees:
        if heads and (heads % n or kv_heads % n):
            raise UsageError(f"--tp {n}: the model has {heads} attention heads and {kv_heads} key/value heads, "
                             f"which do not divide by {n}; pick a degree that divides both")


def check_devices(device: str, degrees: tuple[int, ...]) -> None:
    """On CUDA each rank takes one GPU (cuda:rank): the largest degree must not exceed those visible."""
    if not device.startswith("cuda"):
        return
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if max(degrees) > visible:
        raise UsageError(f"--tp {max(degrees)} needs {max(degrees)} GPUs, but {visible} are visible "
                         "(CUDA_VISIBLE_DEVICES); lower --tp or use --device cpu")
    if device not in ("cuda", "cuda:0"):
        raise UsageError(f"--tp places rank r on cuda:r; pass --device cuda, not {device!r}")
