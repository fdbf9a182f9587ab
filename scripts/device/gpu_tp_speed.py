"""Tensor parallelism's decode step at the 8B shape, next to one GPU: TP1, TP2, TP4; eager and compiled.

    python3 scripts/device/gpu_tp_speed.py [--worlds 1,2,4] [--batches 1,8,64] [--layers 36] [--out DIR]

The model: a random Qwen3 of Qwen3-8B's shape (hidden 4096, 12288 MLP, 32 / 8 heads of 128, vocab
151936, untied lm_head, bf16), built here and saved once (nothing downloaded). Each world size runs
in its own spawned ranks (NCCL), loaded the way `nondet probe --tp N` loads (probes/tp/load.py:
transformers' DistributedConfig where it exists). Per batch size, kernels and path, one generate
call of a 32-token prompt on every rank, timed on rank 0 between consecutive tokens (generate syncs
every step, so the gaps are decode steps' wall time; the median of TOKENS - 2 gaps):

    kernels   default | batch-invariant (the mode) | tp-invariant (the mode with the K tree of
              --tp-invariant for --tree-degree, default the largest world asked; TP1 too). Each runs
              as the TP worker decodes: the TP linears on plain local shards without transformers'
              wrappers (probes/tp/local_params.py); a name ending in "+dtensor" keeps transformers'
              DTensors and wrappers (the path before 2026-11-28; "+local", as rows of that day were
              named, is the plain name); "+gather" keeps the mode's all-reduce on its all-gather route
              (the mode's before 2026-11-29: kernels/symmetric_sum.py's one-shot not taken, same bits)
    path      eager: transformers' dynamic cache, no compile (the probe's default path)
              compiled: a static cache and transformers' compile config (torch.compile,
              CUDA graphs), the path of `nondet probe --compile`; the mode with traceable=True

Each row also has the bits of the last step's logits at row 0 (a hash) so eager vs compiled and
TP degrees can be compared, and, compiled, the graphs dynamo compiled, its graph breaks and Inductor's
CUDA-graph skips (with their reasons) during the row; the compiled rows run in the probe's compile
scope (its recompile limit). NONDET_TP_ALL_GUARDS=1 keeps every dynamo guard of the TP step; the guards'
cost is measured with --count-guards and the knobs of tp_guards.py (dumped, dropped, timed with pinned
threads), NONDET_TP_STANCE_ROWS=1 (rows timed again with the guard check cut) and NONDET_TP_DICT_TAGS=1
(dynamo's dict-tag shortcut); NONDET_TP_PROFILE_STACK=1 adds to --profile's tables one of self CPU time by
Python stack (5 frames); NONDET_TP_TRACE=1 writes rank 0's Chrome trace of the profiled call (read by
trace_steps.py); NONDET_TP_DEFER_STOP=1 times each row again with generate's stop check read one step late
(the host no longer waits for the GPU every step). Writes $OUT/tp_speed.json and prints a Markdown table; a
row that raised holds the error's first line.
"""

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
from gpu_compile import _StepClock as StepClock  # noqa: E402
from tp_guards import (COUNTERS, GUARD_US, PIN_ROWS, counting_filter, pinned_figures,  # noqa: E402
                       record_guard_latency)

PROMPT = 32
CUDA = os.environ.get("DEVICE", "cuda") == "cuda"
# NONDET_TP_ALL_GUARDS=1: the compiled TP step keeps every dynamo guard (the probe's path before
# compiled.tp_layout_guard_filter), for before / after figures
NO_GUARD_FILTER = os.environ.get("NONDET_TP_ALL_GUARDS") == "1"
# NONDET_TP_STANCE_ROWS=1: each compiled row also timed with dynamo's guards cut to the differentiating ones
# (torch.compiler.set_stance(skip_guard_eval_unsafe=True)) around its timed calls: what the full guard check
# costs a step on the critical path; the row gets ms_skip_guards and the logits' hash under it
STANCE_ROWS = os.environ.get("NONDET_TP_STANCE_ROWS") == "1"
# NONDET_TP_DEFER_STOP=1: each row also timed with transformers' deferred stop check allowed on this device: it
# reads generate's "all finished?" flag one step late, so the host queues step n + 1 while the GPU runs step n
# (transformers turns it on for mps only; its extra last forward is undone): ms_deferred, logits_deferred
DEFER_STOP = os.environ.get("NONDET_TP_DEFER_STOP") == "1"
PROFILE_STACKS = os.environ.get("NONDET_TP_PROFILE_STACK") == "1"  # --profile: also self CPU time by Python frame
TRACE = os.environ.get("NONDET_TP_TRACE") == "1"  # --profile: also rank 0's Chrome trace (timeline gaps)
# NONDET_TP_DICT_TAGS=1: every rank compiles with dynamo's recursive dict-tag guard shortcut on (off in torch by
# default), for its figures
DICT_TAGS = os.environ.get("NONDET_TP_DICT_TAGS") == "1"


def build(path: Path, layers: int, hidden: int) -> None:
    """Qwen3-8B's shape with random weights (seed 0), saved with save_pretrained (kept when present)."""
    if (path / "config.json").exists():
        return
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=151936, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=max(hidden // 128, 2), num_key_value_heads=max(hidden // 512, 2),
                      head_dim=128, max_position_embeddings=4096, tie_word_embeddings=False,
                      pad_token_id=0, eos_token_id=2, bos_token_id=1)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda" if CUDA else "cpu"):
        model = Qwen3ForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(path)
    del model


def kernels_scope(kernels: str, model, compiled: bool, max_world: int, world: int):
    """The row's kernels, on local shards unless the name ends in "+dtensor" (the module doc)."""
    from nondet.kernels import batch_invariant, collective, tp_tree
    from nondet.probes.tp.local_params import local_linear_params

    stack = contextlib.ExitStack()
    if not kernels.endswith("+dtensor"):
        stack.enter_context(local_linear_params(model))
    if base_kernels(kernels) != "default":
        stack.enter_context(batch_invariant(model=model, traceable=compiled))
    if base_kernels(kernels) == "tp-invariant":
        stack.enter_context(tp_tree.tree_linears(model, max_world // world))
        stack.enter_context(collective.tree_order())
    if kernels.endswith("+gather"):  # the all-gather route: the one-shot never taken in this row
        from unittest import mock

        from nondet.kernels import collective

        stack.enter_context(mock.patch.object(collective, "one_shot_takes", lambda tensor, group: False))
    return stack


def base_kernels(name: str) -> str:
    """The kernels of a row name, without its parameters suffix ("+dtensor", or "+local": the plain name)
    or its collective's ("+gather": the mode's all-reduce on its all-gather route)."""
    return name.removesuffix("+gather").removesuffix("+local").removesuffix("+dtensor")


def decode(model, batch: int, tokens: int, compiled: bool, count_guards: bool = False,
           repeats: int = 1) -> tuple[float, float, list[float], str, dict]:
    """(first call s, ms per decode step, each timed call's ms, hash of row 0's last logits, the rows' extra
    figures of NONDET_TP_STANCE_ROWS, _PIN_ROWS and _DEFER_STOP, or {}): after a first call of `tokens`,
    `repeats` timed calls, each the median gap between its tokens; the step is their median and the table
    shows their range (one timed call a row could not rank rows within 10%: the same row varied
    7-14% between runs on one host, docs/benchmarks.md 2026-11-30)."""
    from nondet.probes.core.compiled import generation_fields, tp_layout_guard_filter
    from nondet.probes.core.deferred_stop import deferred_stop_check, defers_stop

    device = model.device
    ids = torch.randint(5, 2000, (batch, PROMPT), generator=torch.Generator().manual_seed(batch)).to(device)
    guards = None if NO_GUARD_FILTER else tp_layout_guard_filter(model)
    if count_guards:
        guards = counting_filter(model, guards)
    fields = generation_fields("inductor", device.type, guards) if compiled else {"disable_compile": True}

    def call(streamer=None):
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                              min_new_tokens=tokens, do_sample=False, pad_token_id=0, streamer=streamer,
                              output_logits=True, return_dict_in_generate=True, **fields)

    def timed_calls(scope=contextlib.nullcontext):
        """(each of `repeats` calls' median gap between tokens, ms; the last call's output), each call in scope()."""
        per_call = []
        for _ in range(repeats):
            clock = StepClock()  # gpu_compile.py's: the time each new token reaches the host
            with scope():
                out = call(clock)
            gaps = [1000 * (b - a) for a, b in zip(clock.times[2:], clock.times[3:])]  # [0] prompt, [1] after prefill
            per_call.append(statistics.median(gaps))
        return per_call, out

    started = time.perf_counter()
    call()  # compile and capture (compiled); kernels' first launches (eager)
    first = time.perf_counter() - started
    per_call, out = timed_calls()
    digest = logits_hash(out)
    extra = {}
    if compiled and STANCE_ROWS:
        skipped, stance_out = timed_calls(
            lambda: torch.compiler.set_stance("default", skip_guard_eval_unsafe=True))
        extra.update(ms_skip_guards=round(statistics.median(skipped), 3), logits_skip_guards=logits_hash(stance_out))
    if compiled and PIN_ROWS:
        extra.update(pinned_figures(timed_calls))
    if DEFER_STOP:
        deferred, deferred_out = timed_calls(lambda: deferred_stop_check(defers_stop(model.device, assisted=False)))
        extra.update(ms_deferred=round(statistics.median(deferred), 3), logits_deferred=logits_hash(deferred_out))
    return first, statistics.median(per_call), per_call, digest, extra


def logits_hash(out) -> str:
    """The bits of row 0's logits at the last generated token (a generate output with logits), 12 hex digits."""
    return hashlib.sha256(out.logits[-1][0].float().cpu().numpy().tobytes()).hexdigest()[:12]


def profile(model, world: int, out: str, write: bool, compiled: bool = False, kernels: str = "default",
            batch: int = 1) -> None:
    """Where a step's time goes on rank 0 (write): top ops by self CPU and GPU time, of a short generate
    call at `batch` (eager, default kernels; or compiled, after the timed rows compiled and captured its
    graphs, so the profile sees replays: the collectives' GPU time inside the step). Every rank runs the
    same calls (the collectives must match)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    with torch.inference_mode():
        decode(model, batch, 6, compiled)  # warm
        with torch_profile(activities=activities, with_stack=PROFILE_STACKS) as prof:
            decode(model, batch, 6, compiled)
    if not write:
        return
    averages = prof.key_averages()
    text = averages.table(sort_by="self_cpu_time_total", row_limit=20)
    if CUDA:
        text += "\n" + averages.table(sort_by="self_cuda_time_total", row_limit=25)
    if PROFILE_STACKS:  # where the host's time goes, by Python frame
        text += "\n" + prof.key_averages(group_by_stack_n=5).table(sort_by="self_cpu_time_total", row_limit=25)
    name = f"_compiled_{kernels.replace('+', '_')}_b{batch}" if compiled else ""
    Path(out, f"tp{world}_profile{name}.txt").write_text(text)
    if TRACE:
        prof.export_chrome_trace(str(Path(out, f"tp{world}_trace{name}.json")))


CUDAGRAPH_SKIPS: list[str] = []  # Inductor's reasons for running a compiled graph without CUDA graphs


def record_cudagraph_skips() -> None:
    """Keep Inductor's "skipping cudagraphs due to ..." messages (logged only under TORCH_LOGS otherwise):
    a graph without CUDA graphs launches every kernel from the host, which a step's time shows."""
    from torch._inductor import cudagraph_utils, output_code

    original = cudagraph_utils.log_cudagraph_skip_and_bump_counter

    def log(msg: str) -> None:
        CUDAGRAPH_SKIPS.append(msg[:200])
        original(msg)

    for module in (cudagraph_utils, output_code):
        if hasattr(module, "log_cudagraph_skip_and_bump_counter"):
            module.log_cudagraph_skip_and_bump_counter = log


def dynamo_counts() -> dict:
    """Graphs dynamo compiled, graph breaks it met and CUDA-graph skips so far in this process."""
    from torch._dynamo.utils import counters

    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
            "cudagraph_skips": len(CUDAGRAPH_SKIPS)}


def break_reasons(before: dict) -> list[str]:
    """The graph-break reasons (dynamo's counter keys) that came up since `before` (a copy of the counter)."""
    from torch._dynamo.utils import counters

    new = {k: v - before.get(k, 0) for k, v in counters["graph_break"].items() if v > before.get(k, 0)}
    return [f"{n}x {k[:240]}" for k, n in sorted(new.items(), key=lambda kv: -kv[1])[:4]]


def rank_main(rank: int, world: int, port: int, args, out_file: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if CUDA:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if CUDA else "gloo", rank=rank, world_size=world)
    if DICT_TAGS:  # this rank's process only: set before anything compiles
        torch._dynamo.config.use_recursive_dict_tags_for_guards = True
    from transformers import AutoModelForCausalLM

    from nondet.probes.core.compiled import compile_scope
    from nondet.probes.tp.load import tp_kwargs

    started = time.perf_counter()
    kwargs = tp_kwargs(world) if world > 1 else {}
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, **kwargs).eval()
    if world == 1:
        model = model.to("cuda" if CUDA else "cpu")
    load_s = time.perf_counter() - started
    rows = []
    record_cudagraph_skips()
    if args.count_guards:
        record_guard_latency()
    if args.profile and "eager" in args.paths:
        profile(model, world, args.out, rank == 0)
    tree = args.tree_degree or max(args.worlds)  # the K tree's leaves: the largest degree compared
    kernels = [k for k in args.kernels if not k.startswith("tp-invariant") or tree > 1]
    for compiled in [path == "compiled" for path in args.paths]:
        for kernel in kernels:
            for batch in args.batches:
                row = {"world": world, "kernels": kernel, "path": "compiled" if compiled else "eager", "batch": batch}
                before, guard_checks_before = dynamo_counts(), len(GUARD_US)
                breaks_before = dict(torch._dynamo.utils.counters["graph_break"])
                try:
                    with kernels_scope(kernel, model, compiled, tree, world), torch.inference_mode(), \
                            compile_scope():  # the probe's recompile limit and Inductor cache folder
                        first, ms, calls, digest, extra = decode(model, batch, args.tokens, compiled,
                                                                  args.count_guards, args.repeats)
                    row.update(first_call_s=round(first, 2), ms=round(ms, 3), ms_calls=[round(c, 3) for c in calls],
                               logits=digest, **extra)
                    if compiled:  # a break leaves pieces eager and outside CUDA graphs: the step's time says why
                        row.update({k: v - before[k] for k, v in dynamo_counts().items()})
                        if args.count_guards:
                            row.update(COUNTERS[id(model)][1])
                            measured = GUARD_US[guard_checks_before:]  # none: the row reused a graph
                            row["guard_us"] = round(measured[-1], 1) if measured else None
                        row["skip_reasons"] = sorted(set(CUDAGRAPH_SKIPS[before["cudagraph_skips"]:]))[:3]
                        row["break_reasons"] = break_reasons(breaks_before)
                except Exception as exc:  # noqa: BLE001 (a benchmark row: record and go on)
                    row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}" if str(exc) else type(exc).__name__
                    if rank == 0:
                        traceback.print_exc()
                rows.append(row)
                if rank == 0:
                    print(json.dumps(row), flush=True)
                    Path(out_file).write_text(json.dumps({"load_s": round(load_s, 1), "rows": rows}))
                if args.profile and compiled and batch == args.batches[0] and "error" not in row:
                    with kernels_scope(kernel, model, compiled, tree, world), compile_scope():
                        profile(model, world, args.out, rank == 0, compiled=True, kernels=kernel, batch=batch)
            torch._dynamo.reset()
    dist.barrier()
    dist.destroy_process_group()


def run_world(world: int, args) -> dict:
    from nondet.probes.tp.group import free_port

    port = free_port()
    out_file = f"{args.out}/tp{world}{args.tag}.json"
    try:
        mp.spawn(rank_main, args=(world, port, args, out_file), nprocs=world, join=True)
    except Exception as exc:  # noqa: BLE001 (one world failing leaves the others' rows)
        print(f"world {world}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    return json.loads(Path(out_file).read_text()) if Path(out_file).exists() else {"rows": []}


def table(results: dict) -> str:
    lines = ["| TP | path | kernels | " + " | ".join(f"B = {b} ms" for b in results["batches"]) + " | first call s (B max) |",
             "| --- | --- | --- | " + " | ".join("---:" for _ in results["batches"]) + " | ---: |"]
    rows = [r for w in results["worlds"].values() for r in w["rows"]]
    keys = sorted({(r["world"], r["path"], r["kernels"]) for r in rows}, key=lambda k: (k[1], k[2], k[0]))
    for world, path, kernels in keys:
        cells = {r["batch"]: r for r in rows if (r["world"], r["path"], r["kernels"]) == (world, path, kernels)}
        shown = [_cell(cells[b]) if b in cells else "—" for b in results["batches"]]
        last = cells.get(max(results["batches"]), {})
        lines.append(f"| {world} | {path} | {kernels} | " + " | ".join(shown) + f" | {last.get('first_call_s', '—')} |")
    return "\n".join(lines)


def _cell(row: dict) -> str:
    """A row's ms, with the range of its timed calls when there were several ("9.01 (8.95-9.20)")."""
    if "ms" not in row:
        return row.get("error", "?")[:40]
    calls = row.get("ms_calls", [])
    return f"{row['ms']} ({min(calls)}-{max(calls)})" if len(calls) > 1 else str(row["ms"])


def bits_across_degrees(results: dict) -> list[str]:
    """Per path, kernels and batch size run at several degrees: whether row 0's last logits agree (their
    hashes). --tp-invariant must agree everywhere; the others are expected to differ between degrees."""
    rows = [r for w in results["worlds"].values() for r in w["rows"] if "logits" in r]
    lines = []
    for path, kernels, batch in sorted({(r["path"], r["kernels"], r["batch"]) for r in rows}):
        by_world = {r["world"]: r["logits"] for r in rows if (r["path"], r["kernels"], r["batch"]) == (path, kernels, batch)}
        if len(by_world) > 1:
            verdict = "equal" if len(set(by_world.values())) == 1 else "differ"
            lines.append(f"{path} {kernels} B = {batch}: {verdict} " + ", ".join(f"TP{w} {h}" for w, h in sorted(by_world.items())))
    return lines


def rows_of_cut_runs(out: str, parts: dict) -> list[tuple[str, list]]:
    """(world, rows) of the runs a budget ended before they wrote tp_speed{tag}.json: rank 0 writes
    tp{world}{tag}.json after every row, so the rows it finished are kept."""
    cut = []
    for f in sorted(Path(out).glob("tp[0-9]*-*.json")):
        world, tag = f.stem[2:].split("-", 1)
        if world not in parts.get(f"-{tag}.json", {}).get("worlds", {}):
            cut.append((world, json.loads(f.read_text())["rows"]))
    return cut


def merge(out: str) -> None:
    """One table (and the bits across degrees) from the runs side by side in `out` (tp_speed-*.json)."""
    parts = {f.name.removeprefix("tp_speed"): json.loads(f.read_text()) for f in sorted(Path(out).glob("tp_speed-*.json"))}
    worlds: dict = {}  # one degree may come from several runs (one per kernels, side by side): their rows joined
    for part in parts.values():
        for w, run in part["worlds"].items():
            worlds.setdefault(w, {"rows": []})["rows"] += run["rows"]
    for w, rows in rows_of_cut_runs(out, parts):
        worlds.setdefault(w, {"rows": []})["rows"] += rows
    rows = [r for run in worlds.values() for r in run["rows"]]
    if not rows:
        return
    first = next(iter(parts.values()), {"batches": list(dict.fromkeys(r["batch"] for r in rows))})
    merged = {**first, "worlds": worlds}
    text = table(merged) + "\n\n" + "\n".join(bits_across_degrees(merged)) + "\n"
    Path(out, "tp_speed.md").write_text(text)
    Path(out, "tp_speed.json").write_text(json.dumps(merged, indent=1))
    print(text, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 64])
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3, help="timed generate calls per row after the first (the row: their median)")
    p.add_argument("--model", default="")
    p.add_argument("--paths", type=lambda s: s.split(","), default=["eager", "compiled"])
    p.add_argument("--kernels", type=lambda s: s.split(","), default=["default", "batch-invariant", "tp-invariant"])
    p.add_argument("--profile", action="store_true", help="also profile a step per world: eager, default kernels at B = 1; compiled, every kernels at the first of --batches")
    p.add_argument("--count-guards", action="store_true", help="compiled rows: the guards dynamo built and kept, and their check's latency (guard_us)")
    p.add_argument("--tag", default="", help="a suffix of the output files (two runs in one $OUT)")
    p.add_argument("--tree-degree", type=int, default=0, help="tp-invariant's tree for this degree (default: the largest of --worlds; runs of one degree each, side by side, pass the largest of them all)")
    p.add_argument("--merge", action="store_true", help="merge the tp_speed-*.json of runs side by side in --out into one table, then stop")
    p.add_argument("--build-only", action="store_true", help="build and save the model, then stop (runs side by side share it)")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/nondet-tp-speed"))
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.merge:
        return merge(args.out)
    args.model = args.model or f"/tmp/nondet-qwen3-8b-shape-{args.hidden}x{args.layers}"
    started = time.perf_counter()
    build(Path(args.model), args.layers, args.hidden)
    print(f"model built in {time.perf_counter() - started:.0f} s", flush=True)
    if args.build_only:
        return
    worlds = [w for w in args.worlds if not CUDA or w <= torch.cuda.device_count()]
    results = {"device": torch.cuda.get_device_name(0) if CUDA else "cpu", "torch": torch.__version__,
               "layers": args.layers, "hidden": args.hidden, "batches": args.batches, "tokens": args.tokens,
               "worlds": {}}
    for world in worlds:
        results["worlds"][str(world)] = run_world(world, args)
        Path(args.out, f"tp_speed{args.tag}.json").write_text(json.dumps(results, indent=1))
        print(table(results), flush=True)
    import transformers

    results["transformers"] = transformers.__version__
    Path(args.out, f"tp_speed{args.tag}.json").write_text(json.dumps(results, indent=1))
    Path(args.out, f"tp_speed{args.tag}.md").write_text(table(results) + "\n")


if __name__ == "__main__":
    sys.exit(main())
