"""The tensor-parallel source: the static probe's conditions, run by N worker processes per degree.

    --tp 2      every condition at TP2 (2 ranks, transformers' tp_plan="auto")
    --tp 1,2    every condition at TP1, then at TP2: one run directory, conditions mixing degrees

Per degree, one worker group (probes/tp/group.py) runs that degree's conditions in order; rank 0
sends each condition's target rows here, and this process builds the records the probe loop
writes (one writer, one run directory). Condition ids and labels name the degree
("default/tp2/bs8/ends", "tp2 bs=8 pos=0,7"); streams and condition records carry "tp". The
reference of every comparison is the prompt alone at batch size 1 at the smallest degree asked;
summary.json adds "tensor_parallel" (probes/tp/summary.py): batch variance at each degree and
each degree's batch-1 stream against the reference degree's.
"""

import dataclasses

from nondet.probes.core import conditions as cond
from nondet.probes.core.batch import tokenize_inputs
from nondet.probes.core.pieces import token_piece
from nondet.probes.core.replay import DecodeSettings, eos_ids, finish_reason
from nondet.probes.core.source import Emit, Opened, Planned, step_record
from nondet.probes.core.summarize import as_summary, summarize_modes
from nondet.probes.static.source import condition_record, plan_static
from nondet.probes.tp import degrees as tp_degrees
from nondet.probes.tp.job import Job
from nondet.rundir.records import ConditionRecord, StreamRecord


class TensorParallelSource:
    # the batches are static ones, run by worker processes: condition records say so in "load" (bisect
    # replays one process and refuses them, one line) and name their degree in "tp"
    kind = "tensor-parallel"

    def __init__(self, config) -> None:
        self.config = config  # ProbeConfig with tp = (degrees, ascending)
        self.degrees: tuple[int, ...] = tuple(sorted(config.tp))
        self.placement = cond.resolve_placement(config.placement, len(config.targets), config.runs)
        self.tokenizer = None
        self.inputs: list[tuple[list[int], list[list[int]]]] = []
        self.jobs: dict[int, tuple] = {}  # degree -> its conditions, in order
        self.group = None  # the running WorkerGroup
        self.group_degree: int | None = None
        self.done_in_group = 0
        self.writer = None
        self.run_ids = 0
        self.decode_by_degree: dict[int, dict] = {}  # --compile: each group's decoder summary (rank 0's)

    def open(self) -> Opened:
        """Check the degrees against the model and devices, tokenize here, start the first group:
        its rank 0 describes the environment the fingerprint records."""
        self.tokenizer, model_config = _tokenizer_and_config(self.config.model)
        tp_degrees.check_heads(model_config, self.degrees)
        tp_degrees.check_devices(self.config.model.device, self.degrees)
        self.inputs = [tokenize_inputs(self.tokenizer, p, self.config.fillers) for p in self.config.targets]
        lengths = [len(target) for target, _ in self.inputs]
        base = plan_static(self.config, self.placement, lengths)
        self.jobs = {d: tuple(_at_degree(c, d) for c in base) for d in self.degrees}
        info = self._start(self.degrees[0])
        return Opened({**info["fingerprint"], "tensor_parallel": self._fingerprint_section(info)})

    def attach(self, writer) -> None:
        self.writer = writer  # later groups add their environment to fingerprint.json

    def plan(self) -> list[Planned]:
        return [Planned(c.condition_id, f"tp{d} {c.label}", c.kernels, (d, c))
                for d in self.degrees for c in self.jobs[d]]

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        degree, condition = planned.plan
        if degree != self.group_degree:
            self._next_group(degree)
        _, condition_id, rows = self.group.next("condition")
        assert condition_id == condition.condition_id, (condition_id, condition.condition_id)
        for row, steps in rows.items():
            prompt_id = condition.row_prompts[row] if condition.row_prompts else condition.prompt_id
            emit(self._stream(condition, degree, row, steps, prompt_id))
        self.done_in_group += 1
        if self.done_in_group == len(self.jobs[degree]):
            self._finish_group()
        record = condition_record(condition)
        return dataclasses.replace(record, label=f"tp{degree} {record.label}", load=self.kind,
                                   extra={**record.extra, "tp": degree})

    def summarize(self, streams: list[dict]):
        from nondet.probes.tp.summary import tp_section
        from nondet.verdict import tp_verdict

        doc = summarize_modes(streams, self.tokenizer, self.config.targets)
        doc["tensor_parallel"] = {**tp_section(streams, self.degrees, self.config.targets),
                                  "tp_invariant": self.config.tp_invariant}
        doc["verdict"] = tp_verdict(doc["tensor_parallel"])  # within each degree, then across them
        doc.update(merged_decode(self.decode_by_degree))
        if self.decode_by_degree:
            doc["tensor_parallel"]["decode_paths"] = {str(d): s.get("decode_path") for d, s in
                                                      sorted(self.decode_by_degree.items())}
        return as_summary(doc)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    def _start(self, degree: int) -> dict:
        """Start the group of one degree; its rank 0's "ready" info (fingerprint, backend, NCCL)."""
        from nondet.probes.tp.group import WorkerGroup, free_port

        c = self.config
        settings = DecodeSettings(c.max_new_tokens, c.temperature, c.seed, kv_cache=c.kv_cache,
                                  allow_uncovered=c.allow_uncovered)
        threads = self.config.threads or (None if self.config.model.device.startswith("cuda") else 1)
        leaves = max(self.degrees) if self.config.tp_invariant else 0
        job = Job(self.config.model, degree, self.jobs[degree], tuple(self.inputs), settings, threads, free_port(),
                  tree_leaves=leaves, compile_backend=c.compile_backend)
        self.group, self.group_degree, self.done_in_group = WorkerGroup(job), degree, 0
        return self.group.next("ready")[2]

    def _next_group(self, degree: int) -> None:
        self.close()
        info = self._start(degree)
        if self.writer is not None:
            self.writer.update_fingerprint(lambda fp: fp["tensor_parallel"]["groups"].append(_group_info(info)))

    def _finish_group(self) -> None:
        """Every condition of the group arrived: let its ranks exit; record how many all-reduces
        took the invariant path (0 = the mode's collective never ran)."""
        done = self.group.finish()
        self.group = None
        summary = done[2] if len(done) > 2 else {}
        degree = self.group_degree
        if summary.get("decode"):
            self.decode_by_degree[degree] = summary["decode"]
        if self.writer is not None:
            self.writer.update_fingerprint(lambda fp: _set_calls(fp, degree, summary))

    def _fingerprint_section(self, info: dict) -> dict:
        from nondet.kernels import collective

        return {"degrees": list(self.degrees), "reference_degree": self.degrees[0],
                "collective": {"default": collective.DEFAULT_NAME, "batch-invariant": collective.NAME},
                "nccl_algo": info.get("nccl_algo"), "nccl_proto": info.get("nccl_proto"),
                "nccl_version": info.get("nccl_version"), "groups": [_group_info(info)],
                "tp_invariant_leaves": max(self.degrees) if self.config.tp_invariant else None}

    def _stream(self, condition: cond.Condition, degree: int, row: int, steps: list[dict],
                prompt_id: int) -> StreamRecord:
        tok = self.tokenizer
        tokens = [s["token"] for s in steps]
        self.run_ids += 1
        return StreamRecord(
            run_id=self.run_ids - 1, condition_id=condition.condition_id, kernels=condition.kernels, position=row,
            is_reference=condition.is_reference and degree == self.degrees[0], prompt_id=prompt_id,
            prompt_tokens=len(self.inputs[prompt_id][0]), finish=finish_reason(tokens, eos_ids(None, tok)),
            text=tok.decode(tokens),
            steps=[step_record(s, token_piece(tok, s["token"])) for s in steps],
            extra={"tp": degree, "tp_reference": condition.is_reference})


def _at_degree(condition: cond.Condition, degree: int) -> cond.Condition:
    """'default/bs8/ends' -> 'default/tp2/bs8/ends': ids stay unique when degrees share a run directory."""
    kernels, _, rest = condition.condition_id.partition("/")
    return dataclasses.replace(condition, condition_id=f"{kernels}/tp{degree}/{rest}")


def merged_decode(by_degree: dict[int, dict]) -> dict:
    """The compiled path over every degree's group: per kernels mode its time summed, "eager" where any
    degree fell back (its reason), and the graph census's findings of every group; {} when eager."""
    if not by_degree:
        return {}
    from nondet.probes.core.compiled import ModePath

    blank = dataclasses.asdict(ModePath())  # a mode's entry before any degree: compiled, times and counts 0
    summed = [key for key, value in blank.items() if isinstance(value, (int, float))]
    doc: dict = {}
    for degree, summary in sorted(by_degree.items()):
        path = summary.get("decode_path")
        if path:
            merged = doc.setdefault("decode_path", {"compiled": path["compiled"], "modes": {}})
            for mode, entry in path["modes"].items():
                into = merged["modes"].setdefault(mode, dict(blank))
                if entry["path"] != "compiled" and into["path"] == "compiled":
                    into.update(path=entry["path"], reason=f"TP{degree}: {entry['reason']}")
                for key in summed:
                    into[key] = round(into[key] + entry.get(key, 0), 3)
        if "compiled_graph_census" in summary:
            doc["compiled_graph_census"] = _add_census(doc.get("compiled_graph_census"), summary["compiled_graph_census"])
        if "kernel_coverage" in summary:
            doc["kernel_coverage"] = summary["kernel_coverage"]
    return doc


def _add_census(total: dict | None, more: dict) -> dict:
    """Two groups' graph census (GraphCensus.to_json) as one: counts added, findings joined."""
    from nondet.kernels.graph_census import GraphCensus

    if total is None:
        return more
    census = GraphCensus.from_json(total)
    census.add(GraphCensus.from_json(more))
    return census.to_json()


def _group_info(info: dict) -> dict:
    return {k: v for k, v in info.items() if k != "fingerprint"}


def _set_calls(fp: dict, degree: int, summary: dict) -> None:
    """A group's collective as it ran: how many all-reduces took the invariant path, by which route
    (kernels/symmetric_sum.py's one-shot or the all-gather), and why not the one-shot where it was tried."""
    for group in fp["tensor_parallel"]["groups"]:
        if group["degree"] == degree:
            group["invariant_all_reduce_calls"] = summary.get("invariant_all_reduce_calls")
            for key in ("invariant_all_reduce_route", "symmetric_sum_refused"):
                if summary.get(key) is not None:
                    group[key] = summary[key]


def _tokenizer_and_config(spec):
    """The tokenizer (conditions are planned and streams decoded here) and the model's config
    (heads checked before any worker starts); the default model is built here, once."""
    from transformers import AutoConfig

    from nondet.errors import ModelLoadError
    from nondet.probes.models.load_checks import load_errors
    from nondet.probes.models.loading import check_device
    from nondet.probes.models.quiet import quiet_loading
    from nondet.probes.tp.load import load_tokenizer, model_source

    check_device(spec.device)
    source = model_source(spec.name)
    try:
        with quiet_loading():
            tokenizer = load_tokenizer(source, spec)
            config = AutoConfig.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
    except load_errors() as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"cannot load model {source!r}: {first[:300]}") from exc
    return tokenizer, config
