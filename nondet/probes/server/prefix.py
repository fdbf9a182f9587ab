"""The prefix axis against a live server: the target on a cold prefix cache vs a warm one.

A server with a prefix cache (vLLM, SGLang, llama.cpp) computes only what no earlier request
left in its cache. Each pair, sent one request at a time (nothing else in flight):

    cold   the target with nothing of it cached: the pair's reference
    warm   a warming request of the target's first part (1 token asked), then the target again:
           its prefix comes from the cache, only the rest is prefilled on top of it

The warming request is the first quarter, half or three quarters of the prompt (cut at a space),
and the whole prompt; its answer's usage.prompt_tokens is the cached prefix's length in the
server's tokens. A server that reports no usage leaves that length unknown: the run is then labelled
with the fraction of the prompt's text sent ("prefix:25%", ..., "prefix:all"), so the four stay four
rows (in order: "all" sorts after the percentages), and the load notes say so.
How a cold state is made (the report says which):
- reset: the engine's cache reset between pairs (vLLM POST /reset_prefix_cache, SGLang POST
  /flush_cache, llama.cpp POST /slots/0?action=erase), the target's text unchanged;
- unique prefix: where no reset is known or it is refused, every pair's prompt starts with its own
  tag ("[nondet a3f9] "), so no earlier request shares any of it: the pair's first send is cold.
Each pair is one prompt id (its cold reference, its warm run), so the diff compares each warm run
with its own cold one; summary.json's "prefill" section (core/prefill_summary.py) holds the axis.
"""

import secrets

from nondet.errors import ServerResponseError, UsageError
from nondet.probes.core.source import Emit, Opened, Planned, step_record
from nondet.probes.server import compare
from nondet.probes.server.client import Client
from nondet.probes.server.responses import parse_completion
from nondet.probes.server.source import (_client_settings, _fingerprint, _local_tokenizer, _path, _payload,
                                         diff_answers, identify)
from nondet.rundir.records import ConditionRecord, StreamRecord, Summary

FRACTIONS = (0.25, 0.5, 0.75, 1.0)  # of the prompt's text each warming request sends
RESETS = {"vLLM": "/reset_prefix_cache", "SGLang": "/flush_cache", "llama.cpp server": "/slots/0?action=erase"}
UNIQUE = "unique prefix"


class PrefixServerSource:
    kind = "server"

    def __init__(self, config) -> None:
        self.config = config  # ProbeConfig with load.mode "server" and prefix forms
        self.client = self.model = self.tokenizer = None
        self.engine: str | None = None
        self.cold = UNIQUE  # how a cold cache is made: the reset path, or UNIQUE
        self.prompts: dict[int, str] = {}  # pair -> its prompt (tagged with UNIQUE), set when its cold request runs
        self.run_ids = 0

    def open(self) -> Opened:
        self.client = Client(_client_settings(self.config.load))
        self.tokenizer = _local_tokenizer(self.config.load.tokenizer)
        identity = identify(self.client)
        self.engine = identity["engine"]
        self.model = self.config.model.name or (identity["models"][0] if identity["models"] else None)
        found = _fingerprint(self.config, identity, self.model)
        self.cold = RESETS.get(self.engine, UNIQUE) if self._reset_works(RESETS.get(self.engine)) else UNIQUE
        found["load"]["prefix_cache"] = {"cold": self.cold_words()}
        return Opened(found)

    def attach(self, writer) -> None:
        pass

    def plan(self) -> list[Planned]:
        """Per pair: its cold request (the reference), then its warming request and the target again."""
        return [Planned(f"default/server/p{k}/{state}", f"p{k} {state}" + (f", {fraction:.0%} of the prompt cached"
                                                                            if state == "warm" else ""),
                        "default", (k, fraction, state))
                for k, fraction in enumerate(FRACTIONS) for state in ("cold", "warm")]

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        k, fraction, state = planned.plan
        if state == "cold":
            self.prompts[k] = self._prompt()
            self._make_cold()
            emit(self._stream(k, planned.condition_id, *self._complete(self.prompts[k]), None))
        else:
            warming, _ = self._complete(_cut(self.prompts[k], fraction), max_tokens=1)
            cached = _fraction_label(fraction) if warming.prompt_tokens is None else warming.prompt_tokens
            emit(self._stream(k, planned.condition_id, *self._complete(self.prompts[k]), cached))
        return ConditionRecord(planned.condition_id, "default", 1, [0], "none", planned.label, load="server",
                               prompt_id=k, extra={"prefix_cache": state, "prefix_fraction": fraction})

    def summarize(self, streams: list[dict]) -> Summary:
        from nondet.probes.core.prefill_summary import prefill_section

        doc = diff_answers(streams, self.tokenizer)
        section = prefill_section(streams)
        section["cold"] = self.cold_words()
        notes = [f"prefix cache: cold by {self.cold_words()}; warm after a request of the prompt's first part"]
        uncounted = {f"prefix:{_fraction_label(f)}" for f in FRACTIONS}  # a warm run's "prefill" without usage
        if any(s.get("prefill") in uncounted for s in streams):
            notes.append("prefix cache: the server reported no usage.prompt_tokens for the warming requests, so each "
                         "cached length is the fraction of the prompt's text they sent (25%, 50%, 75%, all), "
                         "not a token count")
        load = {"mode": "server", "compare_level": doc["compare_level"], "endpoint": self.config.load.endpoint,
                "notes": notes}
        return Summary(doc["modes"], doc["verdict"], extra={"load": load, "prefill": section})

    def close(self) -> None:
        pass

    def cold_words(self) -> str:
        if self.cold == UNIQUE:
            return "a unique prefix per pair (no cache reset known for this server)"
        return f"the server's cache reset (POST {self.cold})"

    def _reset_works(self, path: str | None) -> bool:
        if path is None:
            return False
        try:
            self.client.post(path, {})
        except ServerResponseError:  # the engine refuses it (e.g. vLLM without its dev endpoints)
            return False
        return True

    def _make_cold(self) -> None:
        if self.cold != UNIQUE:
            self.client.post(self.cold, {})

    def _prompt(self) -> str:
        """The pair's prompt: the target's text, or with a tag of its own where no reset is known."""
        return self.config.prompt if self.cold != UNIQUE else f"[nondet {secrets.token_hex(3)}] {self.config.prompt}"

    def _complete(self, prompt: str, max_tokens: int | None = None):
        """(the parsed answer, seconds) of one request, nothing else in flight."""
        reply = self.client.post(_path(self.config.load), _payload(self.config, self.model, prompt,
                                                                   max_tokens or self.config.max_new_tokens))
        return parse_completion(reply.body, self.config.load.chat, self.client.url(_path(self.config.load))), reply.seconds

    def _stream(self, k: int, condition_id: str, completion, seconds: float, cached: int | str | None) -> StreamRecord:
        """cached: None for the cold request (the pair's reference); else the warming request's prompt
        tokens, the cached prefix's length as the server counts it, or where it reports no usage the
        fraction of the prompt's text the warming request sent (_fraction_label)."""
        level = compare.level_of(completion.tokens, self.tokenizer)
        steps = compare.steps_at(level, completion.text, completion.tokens, self.tokenizer, completion.ids)
        self.run_ids += 1
        extra = {"load": "server", "compare_level": level, "server_tokens": completion.tokens,
                 "request_index": self.run_ids - 1, "seconds": round(seconds, 3)}
        if cached is not None:
            extra["prefill"] = f"prefix:{cached}"
        return StreamRecord(run_id=self.run_ids - 1, condition_id=condition_id, kernels="default", position=0,
                            is_reference=cached is None, prompt_id=k, prompt_tokens=completion.prompt_tokens,
                            finish=completion.finish, text=completion.text,
                            steps=[step_record(s, s.get("piece", "")) for s in steps], extra=extra)


def _fraction_label(fraction: float) -> str:
    """A warming request's length where the server counts no tokens: its share of the prompt's text ("25%", "all")."""
    return "all" if fraction >= 1.0 else f"{fraction:.0%}"


def _cut(prompt: str, fraction: float) -> str:
    """The prompt's first `fraction` of characters, ended at a space where one is near (whole words)."""
    if fraction >= 1.0:
        return prompt
    end = max(1, int(len(prompt) * fraction))
    space = prompt.rfind(" ", 0, end)
    return prompt[: space if space > end // 2 else end]


def check_server_prefill(config) -> None:
    """Against a server the axis is the prefix cache, at the prompt's quarters: chunked prefill is the
    server's own launch setting, and token counts need the server's tokenizer."""
    if config.prefill != ("prefix:auto",):
        raise UsageError("against a server, --prefix-cache takes auto (a quarter, half, three quarters and all "
                         "of the prompt cached by a warming request); chunked prefill is the server's own setting "
                         "(e.g. vLLM --max-num-batched-tokens): compare two deployments with --against")
    if config.load.against or config.load.resume or config.temperature > 0 or len(config.targets) > 1:
        raise UsageError("--prefix-cache against a server probes one prompt, greedy; drop --against / --resume / "
                         "--temperature")
