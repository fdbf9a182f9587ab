"""Can a probe's second run skip dynamo? The compiled decode step of a random Qwen3 (a static KV cache),
compiled in a fresh process from a cold and then a warm Inductor cache (what `probe --compile` does
today: dynamo traces the model again in every process), against torch's AOT precompile
(`torch.compile(...).aot_compile`, saved to disk, loaded in a fresh process: no trace). Per kernels
mode, one compiled function for every batch size but 1 (the batch dimension marked dynamic), its
outputs' bits checked against the JIT-compiled ones and against eager.

    python scripts/bench_precompile.py                       (CPU: 8 layers of width 256)
    python scripts/bench_precompile.py --device cuda --hidden 1024 --cudagraphs   (the GPU probe case)

Each step runs in its own process (a fresh dynamo), with Inductor's cache in a temporary folder.
Guards that torch cannot save (object identities: the model, its modules, the kernels mode's
functions) are left out of the saved function (aot_step.GUARD_FILTER, as `probe --compile` saves
its steps), so what tells two saved functions apart is the file they are kept in; the kept guards
(shapes, dtypes, strides, ...) are still checked on each call.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

STEPS = ("jit", "jit", "save", "load")  # the first JIT from a cold Inductor cache, the second warm


def build(args):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                      num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                      num_key_value_heads=max(1, args.hidden // 128), head_dim=64, max_position_embeddings=512)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    return Qwen3ForCausalLM(cfg).to(device=args.device, dtype=dtype).eval()


def step(model, ids, pos, cache):
    """One decode step: the logits of `ids` (batch, 1) at cache position `pos`."""
    return model(input_ids=ids, cache_position=pos, past_key_values=cache, use_cache=True).logits


def inputs(model, batch: int, device: str):
    import torch
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=64)
    ids = (torch.arange(batch, device=device).view(batch, 1) * 7 + 5) % model.config.vocab_size
    return ids, torch.tensor([3], device=device), cache


def step_options(args) -> dict:
    from nondet.probes.core.aot_step import GUARD_FILTER

    options = {"guard_filter_fn": GUARD_FILTER()}
    if args.cudagraphs:
        options["triton.cudagraphs"] = True
    return options


def compiled(args):
    from nondet.probes.core.aot_step import aot_compilable

    return aot_compilable(step, {"fullgraph": True, "options": step_options(args)})


def run_step(args, name: str) -> dict:
    """One step in this process: "jit" (compile on first call, every batch), "save" (AOT compile and
    save), "load" (load and call, every batch). -> seconds and, for jit / load, the outputs' file."""
    import torch

    from nondet.kernels import batch_invariant
    from nondet.probes.core import aot_step

    model = build(args)
    mode = batch_invariant(model=model, traceable=True) if args.kernels != "default" else torch.no_grad()
    saved = os.path.join(args.work, f"step-{args.kernels}.bin")
    started = time.perf_counter()
    with torch.no_grad(), mode:
        if name == "save":
            ids, pos, cache = inputs(model, args.batches[0], args.device)
            torch._dynamo.mark_dynamic(ids, 0)
            with aot_step.guard_sources_pickled_by_init_fields():
                function = compiled(args).aot_compile(((model, ids, pos, cache), {}))
                function.save_compiled_function(saved)
            return {"s": time.perf_counter() - started}
        if name == "load":
            with open(saved, "rb") as fh:
                function = aot_step.load_step(fh, step_options(args))
        else:
            function = compiled(args)
        outs = [function(model, *inputs(model, b, args.device)).float().cpu() for b in args.batches]
        seconds = time.perf_counter() - started
        eager = [step(model, *inputs(model, b, args.device)).float().cpu() for b in args.batches]
    path = os.path.join(args.work, f"{name}-{args.kernels}.pt")
    torch.save({"compiled": outs, "eager": eager}, path)
    return {"s": seconds, "outputs": path}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--batches", default="2,3,5", help="batch sizes (one compiled function: not 1)")
    parser.add_argument("--kernels", default="default,batch-invariant")
    parser.add_argument("--cudagraphs", action="store_true", help="Inductor's CUDA graphs (as probe --compile on CUDA)")
    parser.add_argument("--step", help=argparse.SUPPRESS)  # internal: run one step and print its JSON
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.step:
        print("RESULT " + json.dumps(run_step(args, args.step)), flush=True)
        return
    import torch

    print(f"{args.device} torch {torch.__version__}, {args.layers} layers of width {args.hidden}, batches "
          f"{args.batches}{', CUDA graphs' if args.cudagraphs else ''}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| kernels | JIT cold s | JIT warm s | AOT compile + save s | AOT load + calls s | AOT == JIT bits | AOT == eager bits |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    for kernels in args.kernels.split(","):
        with tempfile.TemporaryDirectory() as work:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(work, "inductor"))
            results = [child(args, kernels, name, work, env) for name in STEPS]
            jit, aot = (torch.load(results[i]["outputs"]) for i in (1, 3))
            same_jit = all(torch.equal(a, b) for a, b in zip(aot["compiled"], jit["compiled"]))
            same_eager = all(torch.equal(a, b) for a, b in zip(aot["compiled"], aot["eager"]))
            print(f"| {kernels} | {results[0]['s']:.1f} | {results[1]['s']:.1f} | {results[2]['s']:.1f} | "
                  f"{results[3]['s']:.1f} | {same_jit} | {same_eager} |", flush=True)


def child(args, kernels: str, name: str, work: str, env: dict) -> dict:
    """Run one step in a fresh process; its RESULT line."""
    cmd = [sys.executable, __file__, "--step", name, "--work", work, "--kernels", kernels, "--device", args.device,
           "--layers", str(args.layers), "--hidden", str(args.hidden), "--vocab", str(args.vocab),
           "--batches", ",".join(map(str, args.batches))] + (["--cudagraphs"] if args.cudagraphs else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{kernels} {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


if __name__ == "__main__":
    main()
