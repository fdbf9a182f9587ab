"""Experiment for issue 17 item 3: a static-cache decode step captured in a CUDA graph, under the mode.

    python scripts/gpu_graph_decode.py                  # CUDA: issue 17's GPU case model
    python scripts/gpu_graph_decode.py --device cpu --tiny --tokens 8   # smoke run of the eager path

The probe's decode is host-bound on a GPU (22 ms a step at batch 1 under the mode, a roofline of
63 us: docs/benchmarks.md), so the question before building graphs into the probe is whether
they hold the mode's numerics. For default kernels and for the mode, per batch size, this runs
greedy decoding three ways over the same static KV cache:
    generate   transformers' generate with cache_implementation="static", never compiled (the
               probe's --kv-cache static path), the reference
    eager      a hand loop: one prefill forward, then one forward per token
    graph      the same loop with the decode forward captured once in a torch.cuda.CUDAGraph and
               replayed (inputs copied into static buffers)
and prints, per way, ms per step (the graph way: one capture included) and whether its tokens and its logits' raw bits equal the
reference's. A capture that fails (a host sync inside the forward, an allocation the graph
cannot hold) is reported as one line with the error, not raised. Not part of the product: it
measures whether the probe could take this path (and the mode still hold on it).
"""

import argparse
import time

import torch

from bench_probe import GPU_CASE  # scripts/ is on sys.path when this runs as a script
from gpu_profile_decode import scope
from nondet.probes.default_model import DefaultModelSpec, default_model_dir
from nondet.probes.loading import ModelSpec, load_model
PROMPT = "Tell me about Richard Feynman"


def main() -> None:
    args = _parse()
    spec = DefaultModelSpec() if args.tiny else GPU_CASE
    loaded = load_model(ModelSpec(name=str(default_model_dir(spec)), device=args.device))
    model, tok = loaded.model, loaded.tokenizer
    prompt = tok(PROMPT, return_tensors="pt").input_ids.to(args.device)
    print(f"setup: {args.tokens} greedy tokens after a {prompt.shape[1]}-token prompt, "
          f"{torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'}")
    print("| kernels | batch | way | ms per step | tokens equal | logits bits equal |")
    print("| --- | ---: | --- | ---: | --- | --- |")
    for mode in ("default", "batch-invariant"):
        for batch in args.batches:
            ids = prompt.expand(batch, -1).contiguous()
            with scope(mode, model), torch.inference_mode():
                _compare(mode, batch, model, ids, args)


def _compare(mode, batch, model, ids, args) -> None:
    ways = [("generate", _generate), ("eager", _eager)]
    if args.device.startswith("cuda"):
        ways.append(("graph", _graphed))
    reference = None
    for name, run in ways:
        run(model, ids, args.tokens)  # warm: compiles, allocates, picks
        try:
            started = time.perf_counter()
            tokens, logits = run(model, ids, args.tokens)
            _sync(args.device)
            ms = 1000 * (time.perf_counter() - started) / args.tokens
        except Exception as exc:  # the experiment's finding, e.g. "operation not permitted when stream is capturing"
            print(f"| {mode} | {batch} | {name} | failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]} | | |")
            continue
        if reference is None:
            reference = (tokens, logits)
        same_tokens = torch.equal(tokens, reference[0])
        same_bits = logits is not None and reference[1] is not None and torch.equal(
            logits.view(torch.int16), reference[1].view(torch.int16))
        print(f"| {mode} | {batch} | {name} | {ms:.2f} | {'yes' if same_tokens else 'no'} | "
              f"{'yes' if same_bits else 'no'} |")


def _generate(model, ids, tokens):
    out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                         cache_implementation="static", disable_compile=True, output_logits=True,
                         return_dict_in_generate=True)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1).to(model.dtype)


def _static_cache(model, length: int):
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=length)


def _eager(model, ids, tokens):
    step = _Decoder(model, ids, tokens)
    for _ in range(tokens - 1):
        step.advance(step.forward())
    return step.result()


def _graphed(model, ids, tokens):
    step = _Decoder(model, ids, tokens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm the decode forward off the capture (allocator, lazy init)
        step.forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = step.forward()
    for _ in range(tokens - 1):
        graph.replay()
        step.advance(logits)
    return step.result()


class _Decoder:
    """Greedy decoding over a static cache: the prefill on construction, then forward() decodes the
    token in `self.ids` at `self.position` (device tensors, updated in place so a graph can replay)."""

    def __init__(self, model, ids, tokens):
        self.model, self.cache = model, _static_cache(model, ids.shape[1] + tokens)
        prompt = ids.shape[1]
        out = model(input_ids=ids, past_key_values=self.cache, cache_position=torch.arange(prompt, device=ids.device),
                    use_cache=True)
        self.logits = [out.logits[:, -1].clone()]
        self.ids = self.logits[0].argmax(-1, keepdim=True)  # (B, 1)
        self.tokens = [self.ids.clone()]
        self.position = torch.tensor([prompt], device=ids.device)

    def forward(self):
        return self.model(input_ids=self.ids, past_key_values=self.cache, cache_position=self.position,
                          use_cache=True).logits[:, -1]

    def advance(self, logits) -> None:
        self.logits.append(logits.clone())
        self.ids.copy_(logits.argmax(-1, keepdim=True))
        self.tokens.append(self.ids.clone())
        self.position += 1

    def result(self):
        return torch.cat(self.tokens, 1), torch.stack(self.logits, 1)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--batches", type=lambda s: tuple(int(b) for b in s.split(",")), default=(1, 8, 64))
    p.add_argument("--tiny", action="store_true", help="the embedded default model instead of the GPU case")
    return p.parse_args()


if __name__ == "__main__":
    main()
