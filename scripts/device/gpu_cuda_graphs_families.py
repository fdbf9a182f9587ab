"""`probe --cuda-graphs --confirm` on every model family (tests/family_models.py, bf16, on CUDA), each next to the
same probe eager on the static cache (`--kv-cache static`): the path each kernels mode took (or why it fell back),
the graphs recorded and steps replayed, whether every stream (tokens and logprob bits) equals the eager one, and the
distinct completions. A family the mode refuses gets its one line.

    python3 scripts/device/gpu_cuda_graphs_families.py [FAMILY...]
"""

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import family_models as fm  # noqa: E402
from test_partial_utf8 import _tokenizer  # noqa: E402

from nondet.errors import NondetError  # noqa: E402
from nondet.probes.models.loading import ModelSpec  # noqa: E402
from nondet.probes.probe import ProbeConfig, run_probe  # noqa: E402
from nondet.rundir import RunDir  # noqa: E402
from nondet.rundir.reader import read_streams  # noqa: E402
from nondet.rundir.records import to_json  # noqa: E402


def probe(directory: str, out: Path, **fields) -> dict:
    config = ProbeConfig(prompt="Café 東京 😀 Tell me about Richard Feynman",
                         model=ModelSpec(name=directory, dtype="bfloat16", device="cuda"), batch_sizes=(1, 2, 4),
                         max_new_tokens=16, kernels=("default", "batch-invariant"), out=str(out), **fields)
    return run_probe(config).summary


def streams(out: Path) -> dict:
    """run id -> the steps (token, logprob and top-k as float.hex, margin, experts) of every stream in a run
    directory, as dicts."""
    return {s.run_id: [to_json(step) for step in s.steps] for s in read_streams(RunDir(out), whole=True)}


def difference(eager: dict, graphs: dict) -> str:
    """'yes' where every stream's steps are equal, else 'NO: ' and the fields that differ (e.g. experts)."""
    if eager == graphs:
        return "yes"
    fields = sorted({key for run, steps in eager.items() for a, b in zip(steps, graphs.get(run, []))
                     for key in a.keys() | b.keys() if a.get(key) != b.get(key)})
    lengths = sum(len(steps) != len(graphs.get(run, [])) for run, steps in eager.items())
    return f"NO: {', '.join(fields) or '-'}" + (f"; {lengths} streams of other lengths" if lengths else "")


def row(name: str, work: Path) -> str:
    directory = fm.save_family(name, work / name, _tokenizer())
    started = time.perf_counter()
    try:
        eager = probe(directory, work / f"{name}-static", kv_cache="static")
        graphs = probe(directory, work / f"{name}-graphs", cuda_graphs=True)
    except NondetError as exc:
        return f"| {name} | {type(exc).__name__}: {str(exc)[:140]} | | | | |"
    paths = "; ".join(f"{m}: {p['path']}" + (f" ({p['reason']})" if p["reason"] else "")
                      for m, p in graphs["decode_path"]["modes"].items())
    counts = "; ".join(f"{p.get('graphs_recorded', 0)} / {p.get('steps_replayed', 0)}"
                       for p in graphs["decode_path"]["modes"].values())
    same = difference(streams(work / f"{name}-static"), streams(work / f"{name}-graphs"))
    distinct = " / ".join(str(graphs["modes"][m]["distinct_completions"]) for m in ("default", "batch-invariant"))
    return f"| {name} | {paths} | {counts} | {same} | {distinct} | {time.perf_counter() - started:.1f} |"


def main(names: list[str]) -> None:
    print("| family | path per kernels mode | graphs recorded / steps replayed (default; mode) | streams = "
          "--kv-cache static | distinct default / mode | s |\n| --- | --- | --- | --- | --- | ---: |", flush=True)
    with tempfile.TemporaryDirectory() as work:
        for name in names or fm.ALL_FAMILIES:
            print(row(name, Path(work)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
