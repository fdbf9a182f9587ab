"""The server source: one prompt, many concurrent greedy copies, against a live server.

Order: identify the server (/v1/models, response headers) -> the reference: one copy sent
ALONE, nothing else in flight -> the burst: `runs` copies, at most `concurrency` in flight,
while filler requests arrive as a seeded Poisson process (`rate` per second). Every answer is
emitted (and so appended to streams.jsonl) the moment it arrives, keyed by its request index
(0 = reference, 1..runs = copies), so `--resume RUN_DIR` sends only the indices not on disk:
nothing completed is redone or duplicated. The summary compares all runs at one level
(compare.py).

A `Side` names whose records these are: the lone server of `--endpoint` (the default), or
one of the two deployments of `--endpoint A --against B` (against.py runs one
ServerSource per side, with their own condition ids, run ids and fingerprint entry).
"""

import threading
import time
import warnings
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace

from nondet.errors import ModelLoadError, NondetError, NondetWarning, RunDirError, ServerResponseError, UsageError
from nondet.probes.core import arrivals
from nondet.probes.core.load_config import LoadConfig
from nondet.probes.core.source import Emit, Opened, Planned, step_record
from nondet.probes.server import compare
from nondet.probes.server.client import Client, ClientSettings, public_headers
from nondet.probes.server.engines import engine_of
from nondet.probes.server.responses import parse_completion
from nondet.probes.server.tally import Tally
from nondet.probes.server.traffic import FillerTraffic
from nondet.rundir import RunDir
from nondet.rundir.reader import has_streams, read_fingerprint, read_header_dict, read_stream_dicts
from nondet.rundir.records import ConditionRecord, StreamRecord, Summary
from nondet.verdict import verdict

DEFAULT_RUNS = 16  # concurrent copies besides the reference


@dataclass(frozen=True)
class Side:
    """Which deployment a ServerSource's records belong to."""

    prefix: str = "default/server"  # condition ids: <prefix>/ref, <prefix>/burst
    name: str | None = None  # "A" | "B" of --against (streams, labels, fingerprint load.sides); None = lone
    first_run_id: int = 0  # run id = first_run_id + request index (the two sides share one run directory)
    reference: bool = True  # its request sent alone is the probe's reference (--against: side A only)

    @property
    def lone(self) -> bool:
        return self.name is None

    def ids(self) -> tuple[str, str]:
        return f"{self.prefix}/ref", f"{self.prefix}/burst"


class ServerSource:
    kind = "server"

    def __init__(self, config, on_progress=None, side: Side = Side()) -> None:
        self.config = _resumed(config) if config.load.resume else config
        _check(self.config)
        self.side = side
        self.on_progress = on_progress
        self.writer = self.client = self.tally = self.model = self.tokenizer = None
        self.engine: str | None = None  # the engine the server names (engines.py), once identified
        self.done: set[int] = set()  # request indices already answered on disk (a resume)
        self.lock = threading.Lock()

    def open(self) -> Opened:
        resume, config = self.config.load.resume, self.config
        if resume:  # a new --out that already holds a run was refused before this (probe._open)
            self.done = _done_indices(RunDir(resume))
        self.tally = Tally(_runs(config) + 1, len(self.done), self.on_progress)
        self.client = Client(_client_settings(config.load), self.tally.failed_attempt)
        self.tokenizer = _local_tokenizer(config.load.tokenizer)
        if resume:
            self.model = _stored_model(RunDir(resume))
            return Opened(None, run_dir=resume)
        identity = identify(self.client)
        self.engine = identity["engine"]
        self.model = config.model.name or (identity["models"][0] if identity["models"] else None)
        return Opened(_fingerprint(config, identity, self.model))

    def attach(self, writer) -> None:
        self.writer = writer

    def plan(self) -> list[Planned]:
        config, runs, (ref, burst_id) = self.config, _runs(self.config), self.side.ids()
        burst = [i for i in range(1, runs + 1) if i not in self.done]
        label = f"{runs} copies, {_concurrency(config)} at once, fillers {config.load.resolved_rate():g}/s"
        alone = "alone (reference)" if self.side.reference else "alone"
        return [Planned(ref, self._label(alone), "default", [0] if 0 not in self.done else []),
                Planned(burst_id, self._label(label), "default", burst)]

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        try:
            if planned.condition_id == self.side.ids()[0] and planned.plan:
                self._target(0, emit)  # alone, nothing else in flight
            elif planned.plan:
                self._burst(planned.plan, emit)
        except NondetError as exc:
            if not self.side.lone:  # --against keeps its answers but has no --resume
                raise
            n = len(_done_indices(self.writer.run_dir))
            raise type(exc)(f"{exc}; {n} completed answers are kept in {self.writer.run_dir.path}: "
                            f"finish with `nondet probe --resume {self.writer.run_dir.path}`") from exc
        return self._condition(planned)

    def summarize(self, streams: list[dict]) -> Summary:
        doc = summarize_server(_first_per_index(streams), self.config, self.tokenizer)
        from nondet.probes.core.summarize import sampling_section

        extra = {"load": doc["load"], **sampling_section(self.config, "server")}
        return Summary(doc["modes"], doc["verdict"], extra=extra)

    def close(self) -> None:
        """A resume is recorded even when it fails part-way: which runs came after the interruption."""
        if self.config.load.resume and self.writer is not None:
            added = len(_done_indices(self.writer.run_dir)) - len(self.done)
            self.writer.append_to_header("resumes", {
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs_added": added,
                "endpoint": self.config.load.endpoint})

    def _label(self, text: str) -> str:
        return text if self.side.lone else f"{self.side.name} {self.config.load.endpoint}: {text}"

    def _condition(self, planned: Planned) -> ConditionRecord:
        extra = {} if self.side.lone else {"side": self.side.name, "endpoint": self.config.load.endpoint}
        ref, burst = self.side.ids()
        if planned.condition_id == ref:
            return ConditionRecord(ref, "default", 1, [0], "none", planned.label, load="server", extra=extra)
        return ConditionRecord(burst, "default", _concurrency(self.config), [], "poisson", planned.label,
                               load="server", extra=extra)

    def _burst(self, todo: list[int], emit: Emit) -> None:
        traffic = FillerTraffic(self._send, _filler_schedule(self.config), self.config.fillers,
                                _concurrency(self.config), self.tally).start()
        pool = ThreadPoolExecutor(max_workers=_concurrency(self.config), thread_name_prefix="nondet-copy")
        try:
            futures = [pool.submit(self._target, i, emit) for i in todo]
            finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
            errors = [f.exception() for f in finished if f.exception() is not None]
            if errors:
                raise errors[0]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # in-flight copies finish and are kept
            traffic.stop()

    def _target(self, index: int, emit: Emit) -> None:
        self.tally.sent()
        try:
            reply = self._send(self.config.prompt, self.config.max_new_tokens)
            completion = parse_completion(reply.body, self.config.load.chat, self.client.url(_path(self.config.load)))
        except BaseException:
            self.tally.gave_up()
            raise
        with self.lock:
            emit(self._stream(index, reply, completion))
            if index == 0:
                self.writer.update_fingerprint(lambda fp: self._add_identity(fp, reply))
        self.tally.answered(target=True)

    def _send(self, prompt: str, max_tokens: int):
        return self.client.post(_path(self.config.load), _payload(self.config, self.model, prompt, max_tokens))

    def _stream(self, index: int, reply, completion) -> StreamRecord:
        level = compare.level_of(completion.tokens, self.tokenizer)
        steps = compare.steps_at(level, completion.text, completion.tokens, self.tokenizer, completion.ids)
        side = {} if self.side.lone else {"side": self.side.name, "endpoint": self.config.load.endpoint}
        return StreamRecord(
            run_id=self.side.first_run_id + index, condition_id=self.side.ids()[index != 0], kernels="default",
            position=index, is_reference=index == 0 and self.side.reference, prompt_tokens=completion.prompt_tokens,
            finish=completion.finish, text=completion.text, steps=[step_record(s, s.get("piece", "")) for s in steps],
            extra={"request_index": index, "load": "server", "compare_level": level, **side,
                   "server_tokens": completion.tokens,
                   "request_id": reply.headers.get("x-request-id") or reply.body.get("id"),
                   "answered_model": reply.body.get("model") if isinstance(reply.body.get("model"), str) else None,
                   "seconds": round(reply.seconds, 3), "attempts": reply.attempts})

    def _add_identity(self, fp: dict, reply) -> None:
        """The answer alone's headers join this side's server identity; the reference's model name the run's."""
        load = fp["load"] if self.side.lone else fp["load"]["sides"][self.side.name]
        add_reply_identity(load, fp["model"] if self.side.reference else None, reply)
        self.engine = load["server"].get("engine")


def summarize_server(streams: list[dict], config, tokenizer) -> dict:
    """The diff of all answers at the lowest level any of them allows."""
    summary = diff_answers(streams, tokenizer)
    level = summary["compare_level"]
    summary["load"] = {"mode": "server", "compare_level": summary.pop("compare_level"),
                       "endpoint": config.load.endpoint, **load_settings(config), "notes": level_notes(level)}
    return summary


def diff_answers(streams: list[dict], tokenizer) -> dict:
    """summarize_modes of server answers, all re-stepped to the lowest level any of them allows
    (in place); its "compare_level" says which. Without logprobs it says nothing about bits."""
    from nondet.probes.core.summarize import summarize_modes

    level = compare.lowest(s["compare_level"] for s in streams)
    for s in streams:
        if s["compare_level"] != level:
            s["steps"] = compare.steps_at(level, s["text"], s["server_tokens"], tokenizer)
    summary = summarize_modes(streams, tokenizer if level == "tokenizer" else None)
    if level != "logprobs":
        _no_numeric(summary["modes"]["default"])
    # a server's kernels are its own, unknown here: the verdict speaks of the server, not "default kernels"
    summary["verdict"] = verdict(summary["modes"], level=level, subject="server")
    return {**summary, "compare_level": level}


def load_settings(config) -> dict:
    """The traffic of a server probe, as summary.json's "load" records it."""
    return {"chat": config.load.chat, "runs": _runs(config), "concurrency": _concurrency(config),
            "rate": config.load.resolved_rate(), "rate_unit": "filler requests per second (Poisson)",
            "filler_requests": _filler_count(config)}


NO_LOGPROBS = "server returned no logprobs"  # why a server run has no first numeric divergence


def _no_numeric(m: dict) -> None:
    """Without logprobs there are no bits to compare: the diff's numeric divergence (which falls
    back to the token step) becomes null everywhere, and the mode says why ("numeric_na")."""
    for row in [m, *m["runs"], *m["conditions"]]:
        row["first_numeric_divergence"] = None
    m["numeric_na"] = NO_LOGPROBS


def level_notes(level: str) -> list[str]:
    if level == "logprobs":
        return ["compared token by token with the server's logprobs (exact bits as sent in JSON)"]
    if level == "tokenizer":
        return ["the server returned no logprobs: compared the texts, tokenized locally with --tokenizer"]
    return ["the server returned no logprobs and no --tokenizer was given: compared the texts word by word"]


def identify(client: Client) -> dict:
    """/v1/models where it answers (ids, owners); its response headers; the engine they name
    (engines.py). Unreachable = error; a failing /v1/models is recorded."""
    try:
        reply = client.get("/v1/models")
    except ServerResponseError as exc:  # answered, but not usefully: recorded, not fatal
        return {"models": [], "models_error": str(exc), "headers": {}, "engine": None}
    data = reply.body.get("data")
    entries = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    owners = sorted({m["owned_by"] for m in entries if isinstance(m.get("owned_by"), str)})
    return {"models": [m["id"] for m in entries if m.get("id")], "owned_by": owners,
            "headers": public_headers(reply.headers), "engine": engine_of(owners, reply.headers)}


def _fingerprint(config, identity: dict, model: str | None) -> dict:
    import platform
    import sys

    from nondet import __version__

    return {"nondet": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
            "device": f"server at {config.load.endpoint}", "kernels": "the server's own",
            "model": {"name": model, "embedded_default": False},
            "load": {"mode": "server", "endpoint": config.load.endpoint, "chat": config.load.chat,
                     "tokenizer": config.load.tokenizer, "server": identity}}


def _payload(config, model: str | None, prompt: str, max_tokens: int) -> dict:
    body = {"max_tokens": max_tokens, "temperature": config.temperature}
    if config.temperature > 0:  # every copy the same seed: equal seeds must give equal samples, alone or not
        body["seed"] = config.seed
    if model:
        body["model"] = model
    if config.load.chat:
        from nondet.probes.core.chat import chat_messages

        body.update(messages=chat_messages(prompt, config.system), logprobs=True, top_logprobs=5)
    else:
        body.update(prompt=prompt, logprobs=5)
    return body


def _path(load: LoadConfig) -> str:
    return "/v1/chat/completions" if load.chat else "/v1/completions"


def _filler_schedule(config) -> list:
    """Filler lengths in [1, the copies' length], so fillers still running when the copies are
    done (stop() waits for them) finish soon after."""
    rng = arrivals.run_rng(config.seed, 0)
    return arrivals.per_second(rng, config.load.resolved_rate(), _filler_count(config), len(config.fillers),
                               config.max_new_tokens)


def _resumed(given):
    """The stored probe's settings; the given --endpoint, --timeout and --api-key-env apply."""
    from nondet.probes.core.stored_config import from_stored

    run_dir = RunDir(given.load.resume)
    stored = read_header_dict(run_dir).get("config") or {}
    if (stored.get("load") or {}).get("mode") != "server":
        raise RunDirError(f"{run_dir.path} is not a server probe; --resume finishes interrupted --endpoint probes")
    config = from_stored(type(given), stored)  # a ProbeConfig
    load = replace(config.load, resume=given.load.resume, endpoint=given.load.endpoint or config.load.endpoint,
                   timeout=given.load.timeout, retries=given.load.retries, api_key_env=given.load.api_key_env)
    return replace(config, load=load)


def _check(config) -> None:
    if config.kernels != ("default",):
        raise UsageError("--kernels and --confirm apply to in-process probes; a server runs its own kernels")
    if _runs(config) < 1:
        raise UsageError("--runs must be >= 1")


def _client_settings(load: LoadConfig) -> ClientSettings:
    return ClientSettings(load.endpoint, timeout=load.timeout, retries=load.retries, api_key_env=load.api_key_env)


def _local_tokenizer(name: str | None):
    if name is None:
        return None
    from pathlib import Path

    from transformers import AutoTokenizer

    from nondet.probes.models.loading import is_local_path

    local = Path(name).expanduser()
    if is_local_path(name) and not local.is_dir():  # else the hub's "Repo id must be in the form..." says nothing of it
        raise ModelLoadError(f"tokenizer directory not found: {name}")
    try:
        return AutoTokenizer.from_pretrained(str(local) if local.is_dir() else name)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load tokenizer {name!r}: {str(exc).strip().splitlines()[0][:300]}") from None


def _runs(config) -> int:
    return config.runs if config.runs is not None else DEFAULT_RUNS


def _concurrency(config) -> int:
    return config.load.concurrency or _runs(config)


def _filler_count(config) -> int:
    return config.load.filler_requests if config.load.filler_requests is not None else 2 * _runs(config)


def add_reply_identity(load: dict, model: dict | None, reply) -> None:
    """An answer's headers join the server identity in `load` (fingerprint.json's load, or one
    side's), and its model name the fingerprint's `model` when given and unnamed (some servers
    fail /v1/models, or list nothing for a model they were started with)."""
    load["server"]["completion_headers"] = public_headers(reply.headers)
    if load["server"].get("engine") is None:  # e.g. /v1/models failed: the answer's headers may name it
        load["server"]["engine"] = engine_of(load["server"].get("owned_by", []), reply.headers)
    if isinstance(reply.body.get("system_fingerprint"), str) and reply.body["system_fingerprint"]:
        load["server"]["system_fingerprint"] = reply.body["system_fingerprint"]  # llama.cpp: its build
    answered = reply.body.get("model") if isinstance(reply.body.get("model"), str) else None
    if answered:  # what served the answer: an alias's snapshot, or whatever a llama.cpp server loaded
        load["server"]["answered_model"] = answered
    if model is not None and not model["name"] and answered:
        model["name"] = answered
    elif model is not None and answered and answered != model["name"]:
        warnings.warn(NondetWarning(f"the server answered as model {answered!r}, not {model['name']!r} as listed; "
                                    "fingerprint.json keeps both"), stacklevel=2)


def _first_per_index(streams: list[dict]) -> list[dict]:
    """Stored answers, one per request index (the first kept), in index order."""
    by_index: dict[int, dict] = {}
    for s in streams:
        by_index.setdefault(s["request_index"], s)
    return [by_index[i] for i in sorted(by_index)]


def _stored_model(run_dir: RunDir) -> str | None:
    return ((read_fingerprint(run_dir) or {}).get("model") or {}).get("name")


def _done_indices(run_dir: RunDir) -> set[int]:
    return {s["request_index"] for s in read_stream_dicts(run_dir)} if has_streams(run_dir) else set()
