"""The prefill axis on CUDA: prefix cache (warm vs cold) and chunked prefill, default kernels vs the mode.

    python3 scripts/device/gpu_prefill_axis.py [--out DIR] [--tokens 64]

Two random bf16 models: a dense Qwen3 (hidden 1024, 8 layers, the probe's GPU case) and the
Qwen3-30B-A3B-shaped MoE of gpu_moe.py (4 layers). For each: `nondet probe -b 1 --prefix-cache auto
--chunked-prefill 16,64,128 --confirm` on a prompt of about 300 tokens (each split against one-pass
prefill), then `nondet bisect` on the first default-kernels split whose bits differ.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpu_moe import build, nondet  # noqa: E402

PROMPT = ("Tell me about Richard Feynman: his childhood in Far Rockaway, his work at Los Alamos on the "
          "Manhattan Project, the path integral formulation of quantum mechanics, quantum electrodynamics and "
          "the diagrams that carry his name, the Challenger inquiry and the O-ring in ice water, his lectures "
          "at Caltech, the bongo drums, the safe cracking, and what his colleagues said of him. ") * 3
AXIS = ("-b", "1", "--prefix-cache", "auto", "--chunked-prefill", "16,64,128", "--confirm", "--device", "cuda")


def dense_model() -> str:
    from nondet.probes.models.default_model import DefaultModelSpec, default_model_dir

    spec = DefaultModelSpec(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=64)
    return str(default_model_dir(spec))


def probe_and_bisect(name: str, model: str, out: Path, tokens: int) -> None:
    run = Path(f"/tmp/prefill-{name}")  # the run directory stays here; its prefill section goes to $OUT
    print(f"=== {name}: {model}", flush=True)
    shutil.rmtree(run, ignore_errors=True)  # a warm machine keeps /tmp: the probe refuses a used --out
    nondet("probe", "--model", model, "-p", PROMPT, "-n", str(tokens), *AXIS, "--out", str(run), timeout=400)
    summary = json.loads((run / "summary.json").read_text())
    (out / f"prefill-{name}.json").write_text(json.dumps(summary["prefill"], indent=1))
    for f in summary["prefill"]["by_form"]:
        print(f"{f['kernels']:16} {f['kind']:6} {f['size']:4}  bits from {f['first_numeric_divergence']}  "
              f"tokens from {f['first_token_divergence']}", flush=True)
    differing = [c for c in summary["prefill"]["conditions"]
                 if c["kernels"] == "default" and c["first_numeric_divergence"] is not None]
    if differing:
        nondet("bisect", str(run), "--condition", differing[0]["condition_id"], timeout=300)
        bisect = json.loads((run / "bisect.json").read_text())
        print(f"bisect {differing[0]['condition_id']}: origin {bisect['origin']}, minimal set "
              f"{bisect['minimal_set']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/prefill-axis")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    probe_and_bisect("dense", dense_model(), out, args.tokens)
    moe = Path("/tmp/prefill-moe-model")  # weights stay off $OUT (it comes back over the network)
    build(moe, 4)
    probe_and_bisect("moe", str(moe), out, args.tokens)


if __name__ == "__main__":
    main()
