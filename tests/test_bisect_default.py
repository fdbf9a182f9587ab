"""bisect + ablation on the embedded default model (a short horizon keeps it small).

The origin's op class must be one whose ablation removes the numeric difference at the
origin, and making every class batch-invariant must remove the divergence entirely. The
model carries the batch-variant norm (--inject-variance): whether this host's own kernels
vary within 6 steps depends on the CPU (an AMD EPYC's did not), so the divergence is built.
"""

import pytest

STEPS = 6  # the injected norm differs from the first decode step; no need to reach the flip


@pytest.fixture(scope="module")
def bisected(default_model_dir, tmp_path_factory):
    from nondet.probes.bisect import BisectConfig
    from nondet.probes.bisect_probe import run_bisect
    from nondet.probes.models.loading import ModelSpec
    from nondet.probes.probe import ProbeConfig, run_probe

    out = tmp_path_factory.mktemp("bisect-default") / "run"
    run_probe(ProbeConfig(batch_sizes=(1, 8), placement="last", max_new_tokens=STEPS, out=str(out),
                          model=ModelSpec(inject_variance=True)))
    return run_bisect(BisectConfig(str(out)))


def test_origin_class_is_removed_by_its_ablation(bisected):
    b = bisected.bisect
    origin = b["origin"]
    assert origin is not None and origin["step"] == b["first_numeric_step"]
    own = next(e for e in b["ablation"] if e["ops"] == [origin["op_class"]])
    assert own["origin_removed"], own


def test_all_classes_remove_the_divergence(bisected):
    from nondet.probes.bisect.classify import ABLATABLE  # a dense model: no experts / router replays

    everything = next(e for e in bisected.bisect["ablation"] if sorted(e["ops"]) == sorted(ABLATABLE))
    assert not any({"experts", "router"} & set(e["ops"]) for e in bisected.bisect["ablation"])
    assert everything["activations_match"] and everything["tokens_match"]
    assert everything["steps"] == STEPS
    assert bisected.bisect["minimal_set"] is not None


def test_run_directory_files(bisected):
    from nondet.rundir import RunDir

    rd = RunDir(bisected.run_dir)
    rows = rd.read_csv("bisect_modules.csv")
    origin = bisected.bisect["origin"]
    first = next(r for r in rows if r["differs"] == "True")
    assert (int(first["step"]), first["module"], first["op_class"]) == (origin["step"], origin["module"],
                                                                         origin["op_class"])
    assert rd.read_json("ablation.json")["minimal_set"] == bisected.bisect["minimal_set"]
    assert bisected.bisect["reference_reproduced"] is True
    layers = {a["layer"] for a in bisected.bisect["amplification"]}
    assert layers == {0, 1, 2, 3}
