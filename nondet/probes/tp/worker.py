"""One rank of a worker group: join the process group, load the model, run every condition.

All ranks run the same generate calls in the same order (their collectives must pair up);
rank 0 alone sends results to the parent, which writes the run directory. Messages on each
rank's pipe: ("ready", rank, info), ("condition", condition_id, {row: steps}) or ("bisect", result),
("done", rank, counts),
("error", rank, error class name, one-line message). A worker never prints a traceback
unless NONDET_DEBUG=1; it exits when its parent does (a watchdog thread), so no rank
outlives a parent that was killed.
"""

import os
import traceback

from nondet.errors import debug_enabled
from nondet.probes.core.child_process import one_line, quiet, watch_parent
from nondet.probes.tp.job import FAIL_ENV, Job


def main(rank: int, job: Job, pipe) -> None:
    """The process target (spawned): every failure becomes one ("error", ...) message and exit 1."""
    quiet()
    watch_parent(os.getppid())
    try:
        _run(rank, job, pipe)
    except BaseException as exc:  # noqa: BLE001 - the parent turns it into one line and stops the group
        if debug_enabled():
            traceback.print_exc()
        pipe.send(("error", rank, type(exc).__name__, one_line(exc)))
        pipe.close()
        os._exit(1)
    pipe.close()


def _run(rank: int, job: Job, pipe) -> None:
    import torch

    from nondet.probes.core.numerics import fingerprint, numerics_scope
    from nondet.kernels import collective, symmetric_sum
    from nondet.probes.core import precompiled
    from nondet.probes.core.compiled import census_store
    from nondet.probes.static.decoder import ConditionDecoder
    from nondet.probes.tp.load import load_tp_model
    from nondet.probes.tp.local_params import local_linear_params

    device = _device(rank, job)
    # every degree decodes on one compiled path, transformers' JIT compile with the batch symbolic from the
    # first trace (core/dynamic_jit.py): no saved steps (core/precompiled.py) in this rank's process, TP1's
    # included; NONDET_PRECOMPILE=0 keeps transformers' own JIT compile (batch 1 traced apart)
    os.environ[precompiled.ENV] = "0" if os.environ.get(precompiled.ENV) == "0" else precompiled.JIT
    _join(rank, job, device)
    with numerics_scope(job.threads):
        loaded = load_tp_model(job.spec, job.degree, device)
        store = census_store(loaded.model, f"tp{job.degree}") if job.compile_backend else None
        decoder = ConditionDecoder(job.settings, job.compile_backend, torch.device(device).type, store)
        census = _census(job, loaded.model)  # every rank: the census's forward has collectives to pair up
        if rank == 0:
            kernels = ",".join(dict.fromkeys(c.kernels for c in job.conditions))
            info = {"fingerprint": fingerprint(loaded.description, kernels), **_environment(job, device, loaded.model)}
            info["fingerprint"]["decode_path"] = decoder.label(job.settings.kv_cache)
            if census is not None:  # the run's census, and this group's coverage in its groups entry
                info["fingerprint"]["census"], info["census_coverage"] = census, census["coverage"]
            pipe.send(("ready", rank, info))
        _maybe_fail(rank)
        if job.bisect is not None:
            from nondet.probes.tp.bisect_rank import bisect_on_rank

            result = bisect_on_rank(rank, job.degree, loaded.model, loaded.tokenizer, job.bisect, job.settings)
            if rank == 0:
                pipe.send(("bisect", result))
        with local_linear_params(loaded.model):  # the same local kernels, without DTensors on the host path
            _decode_conditions(rank, job, loaded, decoder, pipe)
    # rank 0's compiled-path bookkeeping (its graph census: every rank compiles the same graphs)
    pipe.send(("done", rank, {"invariant_all_reduce_calls": collective.calls(), "decode": decoder.summary(),
                              "invariant_all_reduce_route": collective.route() if collective.calls() else None,
                              "symmetric_sum_refused": symmetric_sum.refused()}))
    if job.degree > 1:
        torch.distributed.destroy_process_group()


def _decode_conditions(rank: int, job: Job, loaded, decoder, pipe) -> None:
    """Every condition of the job, in order, on this rank; rank 0 sends each one's rows."""
    from nondet.probes.core.batch import batch_shape
    from nondet.probes.core.replay import replay_condition

    prompts = [list(target) for target, _ in job.inputs]
    for condition in job.conditions:
        target, fillers = job.inputs[condition.prompt_id]

        def run(settings, warm=False, condition=condition, target=target, fillers=fillers):
            return replay_condition(loaded.model, loaded.tokenizer, condition, list(target),
                                    [list(f) for f in fillers], settings, prompts, warm)

        with tree_scope(job, condition.kernels, loaded.model):
            rows = decoder.decode(condition.kernels, run, batch_shape(condition, list(target),
                                                                      [list(f) for f in fillers], prompts))
        if rank == 0:
            pipe.send(("condition", condition.condition_id, rows))


def _census(job: Job, model) -> dict | None:
    """Where the group runs the mode: its op census on this rank's shard, before any condition (the
    refusal comes now, as one line; rank 0's entry goes into fingerprint.json). None otherwise."""
    if not any(c.kernels == "batch-invariant" for c in job.conditions):
        return None
    from nondet.probes.core.kernel_coverage import census_entry

    return census_entry(model, False, job.settings.allow_uncovered)


def tree_scope(job: Job, kernels: str, model):
    """--tp-invariant under the mode: the row-parallel K tree (this rank's leaves) and the
    all-reduce that continues it across the ranks; nothing otherwise."""
    import contextlib

    if not job.tree_leaves or kernels != "batch-invariant":
        return contextlib.nullcontext()
    from nondet.kernels import collective, tp_tree

    stack = contextlib.ExitStack()
    stack.enter_context(tp_tree.tree_linears(model, job.tree_leaves // job.degree))
    stack.enter_context(collective.tree_order())
    return stack


def _device(rank: int, job: Job) -> str:
    if job.spec.device.startswith("cuda"):
        import torch

        torch.cuda.set_device(rank)
        return f"cuda:{rank}"
    # CPU ranks on a GPU host: transformers builds its device mesh on the accelerator it detects
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return "cpu"


def _join(rank: int, job: Job, device: str) -> None:
    """The process group (gloo on CPU, NCCL on CUDA), from the env variables transformers reads too."""
    if job.degree == 1:
        return
    import datetime

    import torch.distributed as dist

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(job.degree),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(job.port))
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=job.degree, timeout=datetime.timedelta(minutes=10))


def _environment(job: Job, device: str, model) -> dict:
    """The fingerprint's tensor-parallel facts of this group: backend, NCCL and its settings, and how
    many TP linear parameters decode as plain local shards (local_params.py)."""
    import torch

    from nondet.probes.tp.local_params import shard_linears

    nccl = None
    if device.startswith("cuda"):
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):  # a torch built without NCCL: the backend still says nccl
            nccl = "unknown"
    return {"degree": job.degree, "backend": None if job.degree == 1 else ("nccl" if nccl else "gloo"),
            "nccl_version": nccl, "nccl_algo": os.environ.get("NCCL_ALGO"),
            "nccl_proto": os.environ.get("NCCL_PROTO"), "threads_per_rank": job.threads,
            "local_shard_params": len(shard_linears(model))}


def _maybe_fail(rank: int) -> None:
    """The injected failure of the tests: this rank dies as a crashed worker would, no message."""
    wanted = os.environ.get(FAIL_ENV, "")
    if wanted and int(wanted.split(":")[0]) == rank:
        os._exit(int(wanted.split(":")[1]) if ":" in wanted else 17)
