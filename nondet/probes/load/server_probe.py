"""`nondet probe --endpoint URL`: one prompt, many concurrent greedy copies, against a live server.

Order: identify the server (/v1/models, response headers) -> the reference: one copy sent
ALONE, nothing else in flight -> the burst: `runs` copies, at most `concurrency` in flight,
while filler requests arrive as a seeded Poisson process (`rate` per second). Every answer is
appended to streams.jsonl the moment it arrives, keyed by its request index (0 = reference,
1..runs = copies), so `--resume RUN_DIR` sends only the indices not on disk: nothing
completed is redone or duplicated. The summary compares all runs at one level (compare.py).
"""

import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, replace

from nondet.errors import ModelLoadError, NondetError, RunDirError, ServerResponseError, UsageError
from nondet.probes.load import arrivals, compare
from nondet.probes.load.client import Client, ClientSettings, public_headers
from nondet.probes.load.config import LoadConfig
from nondet.probes.load.responses import parse_completion
from nondet.probes.load.tally import Tally
from nondet.probes.load.traffic import FillerTraffic
from nondet.rundir import RunDir

DEFAULT_RUNS = 16  # concurrent copies besides the reference


def run_server_probe(config, on_progress=None):
    from nondet.probes.probe import ProbeResult, default_run_dir

    started = time.perf_counter()
    config = _resumed(config) if config.load.resume else config
    _check(config)
    run_dir = RunDir(config.load.resume or config.out or default_run_dir("probe"))
    done = _done_indices(run_dir) if config.load.resume else set()
    tally = Tally(_runs(config) + 1, len(done), on_progress)
    client = Client(_client_settings(config.load), tally.failed_attempt)
    tokenizer = _local_tokenizer(config.load.tokenizer)
    model = _stored_model(run_dir) if config.load.resume else _start(run_dir, config, client)
    probe = _Probe(config, client, run_dir, tally, model or None, tokenizer)
    try:
        probe.send_missing(done)
    except NondetError as exc:
        n = len(_done_indices(run_dir))
        raise type(exc)(f"{exc}; {n} completed answers are kept in {run_dir.path}: "
                        f"finish with `nondet probe --resume {run_dir.path}`") from exc
    finally:
        if config.load.resume:
            _record_resume(run_dir, config, len(_done_indices(run_dir)) - len(done))
    summary = summarize_server(_streams(run_dir), config, tokenizer)
    run_dir.write_json("summary.json", summary)
    return ProbeResult(run_dir.path, summary, time.perf_counter() - started)


class _Probe:
    def __init__(self, config, client: Client, run_dir: RunDir, tally: Tally, model: str | None, tokenizer):
        self.config, self.client, self.run_dir, self.tally = config, client, run_dir, tally
        self.model, self.tokenizer = model, tokenizer
        self.lock = threading.Lock()

    def send_missing(self, done: set[int]) -> None:
        if 0 not in done:
            self._target(0)  # the reference: alone, nothing else in flight
        todo = [i for i in range(1, _runs(self.config) + 1) if i not in done]
        if todo:
            self._burst(todo)

    def _burst(self, todo: list[int]) -> None:
        traffic = FillerTraffic(self._send, _filler_schedule(self.config), self.config.fillers,
                                _concurrency(self.config), self.tally).start()
        pool = ThreadPoolExecutor(max_workers=_concurrency(self.config), thread_name_prefix="nondet-copy")
        try:
            futures = [pool.submit(self._target, i) for i in todo]
            finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
            errors = [f.exception() for f in finished if f.exception() is not None]
            if errors:
                raise errors[0]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # in-flight copies finish and are kept
            traffic.stop()

    def _target(self, index: int) -> None:
        self.tally.sent()
        try:
            reply = self._send(self.config.prompt, self.config.max_new_tokens)
            completion = parse_completion(reply.body, self.config.load.chat, self.client.url(_path(self.config.load)))
        except BaseException:
            self.tally.gave_up()
            raise
        with self.lock:
            self.run_dir.append_jsonl("streams.jsonl", self._stream(index, reply, completion))
            if index == 0:
                _record_reference_identity(self.run_dir, reply)
        self.tally.answered(target=True)

    def _send(self, prompt: str, max_tokens: int):
        return self.client.post(_path(self.config.load), _payload(self.config, self.model, prompt, max_tokens))

    def _stream(self, index: int, reply, completion) -> dict:
        level = compare.level_of(completion.tokens, self.tokenizer)
        return {
            "run_id": index, "request_index": index, "condition_id": _condition_id(index),
            "kernels": "default", "position": index, "is_reference": index == 0,
            "prompt_tokens": completion.prompt_tokens, "finish": completion.finish, "text": completion.text,
            "steps": compare.steps_at(level, completion.text, completion.tokens, self.tokenizer),
            "load": "server", "compare_level": level, "server_tokens": completion.tokens,
            "request_id": reply.headers.get("x-request-id") or reply.body.get("id"),
            "seconds": round(reply.seconds, 3), "attempts": reply.attempts,
        }


def summarize_server(streams: list[dict], config, tokenizer) -> dict:
    """The diff of all answers at the lowest level any of them allows."""
    from nondet.probes.probe import summarize_modes

    level = compare.lowest(s["compare_level"] for s in streams)
    for s in streams:
        if s["compare_level"] != level:
            s["steps"] = compare.steps_at(level, s["text"], s["server_tokens"], tokenizer)
    summary = summarize_modes(streams, tokenizer if level == "tokenizer" else None)
    if level != "logprobs":  # no logprobs: say nothing about bits
        _no_numeric(summary["modes"]["default"])
        summary["verdict"] = _text_verdict(summary["modes"]["default"], level)
    summary["load"] = {"mode": "server", "compare_level": level, "endpoint": config.load.endpoint,
                       "chat": config.load.chat, "runs": _runs(config), "concurrency": _concurrency(config),
                       "rate": config.load.resolved_rate(), "rate_unit": "filler requests per second (Poisson)",
                       "filler_requests": _filler_count(config), "notes": _level_notes(level)}
    return summary


NO_LOGPROBS = "server returned no logprobs"  # why a server run has no first numeric divergence


def _no_numeric(m: dict) -> None:
    """Without logprobs there are no bits to compare: the diff's numeric divergence (which falls
    back to the token step) becomes null everywhere, and the mode says why ("numeric_na")."""
    for row in [m, *m["runs"], *m["conditions"]]:
        row["first_numeric_divergence"] = None
    m["numeric_na"] = NO_LOGPROBS


def _text_verdict(m: dict, level: str) -> str:
    unit = "token" if level == "tokenizer" else "word"
    if m["distinct_completions"] == 1:
        return f"server: 1 distinct completion over {m['n_runs']} runs (texts compared {unit} by {unit})"
    return (f"server: batch-variant, {m['distinct_completions']} distinct completions over {m['n_runs']} runs; "
            f"first divergence at {unit} {m['first_token_divergence']}")


def _level_notes(level: str) -> list[str]:
    if level == "logprobs":
        return ["compared token by token with the server's logprobs (exact bits as sent in JSON)"]
    if level == "tokenizer":
        return ["the server returned no logprobs: compared the texts, tokenized locally with --tokenizer"]
    return ["the server returned no logprobs and no --tokenizer was given: compared the texts word by word"]


def _start(run_dir: RunDir, config, client: Client) -> str | None:
    """Identify the server, then write config.json, fingerprint.json and conditions.jsonl."""
    from nondet import __version__

    if run_dir.exists("streams.jsonl"):
        raise UsageError(f"{run_dir.path} already holds a probe; finish it with --resume {run_dir.path} or pass a new --out")
    identity = _identify(client)
    model = config.model.name or (identity["models"][0] if identity["models"] else None)
    run_dir.path.mkdir(parents=True, exist_ok=True)
    run_dir.write_json("config.json", {"command": "probe", "argv": list(config.argv), "config": asdict(config),
                                       "nondet_version": __version__})
    run_dir.write_json("fingerprint.json", _fingerprint(config, identity, model))
    for condition in _conditions(config):
        run_dir.append_jsonl("conditions.jsonl", condition)
    return model


def _identify(client: Client) -> dict:
    """/v1/models where it answers; its response headers. Unreachable = error; a failing /v1/models is recorded."""
    try:
        reply = client.get("/v1/models")
    except ServerResponseError as exc:  # answered, but not usefully: recorded, not fatal
        return {"models": [], "models_error": str(exc), "headers": {}}
    data = reply.body.get("data")
    ids = [m.get("id") for m in data if isinstance(m, dict) and m.get("id")] if isinstance(data, list) else []
    return {"models": ids, "headers": public_headers(reply.headers)}


def _record_resume(run_dir: RunDir, config, runs_added: int) -> None:
    """config.json "resumes": one entry per --resume (UTC time, runs it added, endpoint), so the
    report can say which runs ran after the interruption (possibly on a restarted server)."""
    stored = run_dir.read_json("config.json")
    stored.setdefault("resumes", []).append({
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs_added": runs_added,
        "endpoint": config.load.endpoint})
    run_dir.write_json("config.json", stored)


def _record_reference_identity(run_dir: RunDir, reply) -> None:
    """The reference answer's headers and model name join the server identity (some servers
    fail /v1/models, or list nothing for a model they were started with)."""
    fp = run_dir.read_json("fingerprint.json")
    fp["load"]["server"]["completion_headers"] = public_headers(reply.headers)
    if not fp["model"]["name"] and isinstance(reply.body.get("model"), str):
        fp["model"]["name"] = reply.body["model"]
    run_dir.write_json("fingerprint.json", fp)


def _fingerprint(config, identity: dict, model: str | None) -> dict:
    import platform
    import sys

    from nondet import __version__

    return {"nondet": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
            "device": f"server at {config.load.endpoint}", "kernels": "the server's own",
            "model": {"name": model, "embedded_default": False},
            "load": {"mode": "server", "endpoint": config.load.endpoint, "chat": config.load.chat,
                     "tokenizer": config.load.tokenizer, "server": identity}}


def _conditions(config) -> list[dict]:
    load, runs = config.load, _runs(config)
    return [{"condition_id": _condition_id(0), "kernels": "default", "load": "server", "batch_size": 1,
             "positions": [0], "fillers": "none", "label": "alone (reference)"},
            {"condition_id": _condition_id(1), "kernels": "default", "load": "server",
             "batch_size": _concurrency(config), "positions": [], "fillers": "poisson",
             "label": f"{runs} copies, {_concurrency(config)} at once, fillers {load.resolved_rate():g}/s"}]


def _condition_id(index: int) -> str:
    return "default/server/ref" if index == 0 else "default/server/burst"


def _payload(config, model: str | None, prompt: str, max_tokens: int) -> dict:
    body = {"max_tokens": max_tokens, "temperature": config.temperature}
    if model:
        body["model"] = model
    if config.load.chat:
        body.update(messages=[{"role": "user", "content": prompt}], logprobs=True, top_logprobs=5)
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


def _streams(run_dir: RunDir) -> list[dict]:
    """Stored answers, one per request index (the first kept), in index order."""
    by_index: dict[int, dict] = {}
    for s in run_dir.read_jsonl("streams.jsonl"):
        by_index.setdefault(s["request_index"], s)
    return [by_index[i] for i in sorted(by_index)]


def _stored_model(run_dir: RunDir) -> str | None:
    return ((run_dir.read_json("fingerprint.json").get("model")) or {}).get("name")


def _done_indices(run_dir: RunDir) -> set[int]:
    return {s["request_index"] for s in run_dir.read_jsonl("streams.jsonl")} if run_dir.exists("streams.jsonl") else set()


def _resumed(given):
    """The stored probe's settings; the given --endpoint, --timeout and --api-key-env apply."""
    from nondet.probes.probe import ProbeConfig
    from nondet.probes.loading import ModelSpec

    run_dir = RunDir(given.load.resume)
    stored = run_dir.read_json("config.json").get("config") or {}
    if (stored.get("load") or {}).get("mode") != "server":
        raise RunDirError(f"{run_dir.path} is not a server probe; --resume finishes interrupted --endpoint probes")
    tuples = {k: tuple(stored[k]) for k in ("batch_sizes", "fillers", "kernels", "argv") if k in stored}
    load = LoadConfig(**stored["load"])
    load = replace(load, resume=given.load.resume, endpoint=given.load.endpoint or load.endpoint,
                   timeout=given.load.timeout, retries=given.load.retries, api_key_env=given.load.api_key_env)
    return ProbeConfig(**{**stored, **tuples, "model": ModelSpec(**stored["model"]), "load": load})


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
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load tokenizer {name!r}: {str(exc).strip().splitlines()[0][:300]}") from None


def _runs(config) -> int:
    return config.runs if config.runs is not None else DEFAULT_RUNS


def _concurrency(config) -> int:
    return config.load.concurrency or _runs(config)


def _filler_count(config) -> int:
    return config.load.filler_requests if config.load.filler_requests is not None else 2 * _runs(config)
