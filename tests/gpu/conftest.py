"""GPU tests run only where CUDA is visible; elsewhere they are skipped."""

import pytest


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_model_dir(tmp_path_factory):
    """A random bf16 Qwen3 (hidden 256, 2 layers, 4 heads, 2 KV heads) + tokenizer saved with save_pretrained: wide
    enough that the mode's Triton kernels take their GPU tiles, small enough to decode in seconds."""
    from model_fixtures import save_qwen3

    from nondet.probes.models.default_model import build_tokenizer

    return save_qwen3(tmp_path_factory.mktemp("gpu-qwen3"), build_tokenizer(512), hidden=256, layers=2, heads=4,
                      kv_heads=2, seed=1)
