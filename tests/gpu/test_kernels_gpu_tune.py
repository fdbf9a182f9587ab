"""`nondet kernels tune` on the device: a tuned table never changes a row's bits."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

from nondet.kernels import bench, config, triton_matmul, tune  # noqa: E402


def test_tuned_table_gives_the_untuned_bits(tmp_path, monkeypatch):
    monkeypatch.setenv(config.TUNING_ENV, str(tmp_path / "absent.json"))
    config.clear_tuning_cache()
    torch.manual_seed(1)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16).t()
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    ms = (1, 9, 16, 17, 64, 65, 128, 129, 300, 512, 513, 2000, 8192)
    untuned = [triton_matmul.mm(x[:m], w) for m in ms]

    results = tune.tune(kns=((4096, 4096),))
    path = tmp_path / "kernel-tuning.json"
    tune.write(results, path)
    monkeypatch.setenv(config.TUNING_ENV, str(path))
    config.clear_tuning_cache()
    device = torch.device("cuda")
    assert config.tuning_fingerprint(device)["shapes"] == ["bfloat16 4096x4096"]
    assert [config.matmul_config(torch.bfloat16, r.timed_m[-1], 4096, 4096, device) for r in results] == \
        [r.chosen for r in results]
    assert all(bench.same_bits(triton_matmul.mm(x[:m], w), ref) for m, ref in zip(ms, untuned, strict=True))
    config.clear_tuning_cache()
