"""The compiled decode step's cold compile with each decoder layer a nested compile region, against the whole
step traced flat: compile seconds (torch's breakdown) and the logits' bits. An experiment for the cold probe.

    python3 scripts/device/gpu_region_compile.py --region 1 --kernels default [--model DIR] [--batches 1,4]

One configuration per process (dynamo's state is per process); Inductor's caches off, so each run is cold.
torch.compiler.nested_compile_region traces a layer once and reuses the subgraph for the layers after it
(Inductor compiles it once), where the flat trace unrolls every layer. transformers' compiled static-cache
generate, CompileConfig(fullgraph=True, dynamic=False), so each batch size is its own graph.
"""

import argparse
import contextlib
import hashlib
import json
import os
import time

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--region", type=int, default=1,
                        help="0: flat; 1: each layer a region; 2: a region that enters the traced mode inside it "
                             "(dynamo traces a region's body without the torch function modes around it)")
    parser.add_argument("--kernels", default="default", choices=("default", "batch-invariant"))
    parser.add_argument("--model", default=None, help="a model folder (default: the GPU probe case's random Qwen3)")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, CompileConfig, GenerationConfig

    device = "cuda" if torch.cuda.is_available() else "cpu"
    path = args.model or _gpu_case()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    if args.region:
        _mark_regions(type(model.model.layers[0]), torch, inside=args.region == 2 and args.kernels != "default")
    config = GenerationConfig(max_new_tokens=args.tokens, do_sample=False, cache_implementation="static",
                              compile_config=CompileConfig(fullgraph=True, dynamic=False),
                              output_logits=True, return_dict_in_generate=True)
    config.compile_config._compile_all_devices = True
    row = {"region": args.region, "kernels": args.kernels, "device": device, "torch": torch.__version__}
    mode = contextlib.nullcontext()
    if args.kernels == "batch-invariant":
        from nondet.kernels.mode import batch_invariant

        mode = batch_invariant(model=model, traceable=True)
    with mode:
        for batch in [int(b) for b in args.batches.split(",")]:
            ids = torch.arange(3, 13, device=device).repeat(batch, 1)
            for attempt in ("first", "again"):
                _sync(torch)
                began = time.perf_counter()
                out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
                _sync(torch)
                row[f"B{batch} {attempt} s"] = round(time.perf_counter() - began, 2)
            logits = torch.stack(out.logits)[:, 0].float().cpu()  # (steps, vocab): row 0
            row[f"B{batch} row0 logits"] = hashlib.sha256(logits.numpy().tobytes()).hexdigest()[:12]
    import torch._dynamo.utils as dynamo_utils

    names, values = dynamo_utils.compile_times(repr="csv", aggregate=True)
    wanted = ("bytecode_tracing", "create_aot_dispatcher_function", "compile_fx_inner", "_compile.compile_inner",
              "invoke_subgraph_trace")
    row["compile s"] = {n: round(float(v), 1) for n, v in zip(names, values) if n in wanted}
    print(json.dumps(row))


def _mark_regions(layer_class, torch, inside: bool) -> None:
    """The layer class's forward as a nested compile region; `inside`: the traced mode entered in its body."""
    forward = layer_class.forward
    if inside:
        from nondet.kernels.mode import OP_CLASSES
        from nondet.kernels.traced import TracedMode

        mode = TracedMode(frozenset(OP_CLASSES))
        plain = forward

        def forward(self, *args, **kwargs):
            with mode:
                return plain(self, *args, **kwargs)
    layer_class.forward = torch.compiler.nested_compile_region(forward)


def _sync(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _gpu_case() -> str:
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from bench_probe import GPU_CASE

    from nondet.probes.models.default_model import default_model_dir

    return str(default_model_dir(GPU_CASE))


if __name__ == "__main__":
    main()
