"""`nondet kernels tune`'s table: loaded only for its device and versions, never a different K
order; the summary says whether tuning beat the shipped configuration (pure functions, no GPU)."""

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

from nondet.kernels import config  # noqa: E402
from nondet.kernels.config import MatmulConfig, _load_tuning, matmul_config  # noqa: E402
from nondet.kernels.tune import BucketResult, summary  # noqa: E402

KEY = {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0"}
FAST = MatmulConfig(64, 64, 64, 1024, 8, 4, 4, tma=True)


def table(tmp_path, cfg=FAST):
    path = tmp_path / "kernel-tuning.json"
    buckets = [[16, cfg.__dict__], [None, cfg.__dict__]]
    path.write_text(json.dumps({"key": KEY, "matmul": {"bfloat16": {"4096x4096": buckets}}}))
    return str(path)


def test_a_table_is_used_only_for_its_device_and_versions(tmp_path):
    path = table(tmp_path)
    loaded = _load_tuning(path, tuple(sorted(KEY.items())))
    assert loaded[torch.bfloat16, 4096, 4096] == ((16, FAST), (None, FAST))
    other = {**KEY, "device": "NVIDIA H100 80GB HBM3"}
    assert _load_tuning(path, tuple(sorted(other.items()))) == {}
    assert _load_tuning(str(tmp_path / "absent.json"), tuple(sorted(KEY.items()))) == {}


def test_a_table_that_changes_the_k_order_is_refused(tmp_path):
    path = table(tmp_path, MatmulConfig(64, 64, 32, 1024, 8, 4, 4))
    with pytest.raises(ValueError, match="changes the K order"):
        _load_tuning(path, tuple(sorted(KEY.items())))


def test_cpu_launches_never_consult_a_table():
    assert matmul_config(torch.bfloat16, 1, 4096, 4096, torch.device("cpu")) == config.MATMUL_BUCKETS[torch.bfloat16][0][1]


def result(shipped_us, chosen_us):
    shipped = config.MATMUL_BUCKETS[torch.bfloat16][0][1]
    chosen = shipped if chosen_us == shipped_us else FAST
    return BucketResult(4096, 4096, 16, (1, 16), 10.0, shipped_us, chosen, chosen_us)


def test_summary_reports_the_gain():
    assert summary([result(20.0, 10.0)])[-1] == ("matmul ratio over the tuned buckets (geometric mean): "
                                                  "shipped 0.500 -> tuned 1.000")


def test_summary_says_why_nothing_changed():
    assert summary([result(20.0, 20.0)])[-1] == ("no candidate beat the shipped configuration by 3% in any "
                                                  "bucket (geometric mean 0.500): the tuned table repeats "
                                                  "the shipped one")


@pytest.mark.parametrize("m, n, block_n", [
    (512, 12288, 128),  # 128x256: 192 tiles, 2 rounds on 132 SMs; 128x128: 384 tiles, 3 rounds
    (2048, 1024, 128),  # K / V projections of a long prefill: 64 wide tiles leave half the SMs idle
    (512, 4096, 128),
    (512, 14336, 256),  # 4 rounds of 128x128 against 2 of 128x256: the wide tile wins
    (2048, 4096, 256),
    (8192, 12288, 256),
])
def test_past_m_256_the_tile_follows_the_rounds_it_fills(m, n, block_n):
    chosen = config.by_waves(m, n, 132)
    assert chosen.block_n == block_n
    # speed only: the K order (block_k, k_chunk) is every bucket's
    shipped = config.MATMUL_BUCKETS[torch.bfloat16][-1][1]
    assert (chosen.block_k, chosen.k_chunk) == (shipped.block_k, shipped.k_chunk)


def test_the_square_tile_takes_five_stages_only_where_a_block_has_the_shared_memory(monkeypatch):
    # 5 x 32 KiB of A and W tiles: a Hopper SM's 228 KiB holds them, an A100's 164 does not
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(config, "tuning", lambda device: {})  # the shipped buckets, no tuned table
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    stages = {}
    for name, smem in (("hopper", 228 * 1024), ("ampere", 164 * 1024)):
        monkeypatch.setattr(config, "sm_smem", lambda device, smem=smem: smem)
        stages[name] = {config.matmul_config(torch.bfloat16, 512, 4096, n, cuda).num_stages for n in (4096, 12288)}
        wide = config.matmul_config(torch.bfloat16, 512, 4096, 14336, cuda)
        assert (wide.block_n, wide.num_stages) == (256, 3)  # the wide tile keeps its 3
        assert config.matmul_config(torch.bfloat16, 512, 4096, 4096).num_stages == 4  # no device: no GPU to ask
    assert stages == {"hopper": {5}, "ampere": {4}}


@pytest.mark.parametrize("k, n, stages", [
    (14336, 4096, 3),  # 64 tiles x 7 chunks = 448 programs: 396 resident at 4 stages, 528 at 3
    (12288, 4096, 4),  # 384 programs: resident at 4 already
    (4096, 12288, 4),  # 768 programs: not resident even at 3, so the 4 stages stay
])
def test_a_split_launch_drops_to_3_stages_only_where_that_makes_every_program_resident(k, n, stages, monkeypatch):
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    monkeypatch.setattr(config, "sm_smem", lambda device: 228 * 1024)
    cuda = torch.device("cuda", 0)
    tile = config.MatmulConfig(64, 64, 64, 1024, 8, 4, 4)  # M 64's bucket
    programs = (n // 64) * -(-k // config.k_chunk_for(k, tile))
    chosen = config.resident_split(tile, programs, cuda)
    assert chosen.num_stages == stages
    assert chosen == dataclasses.replace(tile, num_stages=stages)  # speed only: tile and K order kept
    decode = config.MatmulConfig(16, 128, 64, 1024, 8, 4, 4)  # decode tiles keep their swept stages
    assert config.resident_split(decode, 448, cuda) == decode
    assert config.resident_split(tile, programs, torch.device("cpu")) == tile
