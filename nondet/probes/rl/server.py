"""The RL sampler side on a live server: `nondet rl --model MODEL --endpoint URL`.

Each prompt is sent alone to the server's OpenAI-compatible /v1/completions as token ids,
sampled with the run's temperature, top-k, top-p and a per-request seed (seed + prompt index),
asking for the sampled tokens' logprobs and their ids (vLLM: `logprobs`, `return_tokens_as_token_ids`;
serve vLLM with `--logprobs-mode processed_logprobs` so they are over the processed
distribution the trainer replays). The answers become sampler streams of kernels "external"
(the server's own kernels), which the trainer side pairs with every kernels mode, as rollouts.

A server that returns no logprobs gives nothing to compare: one line, exit 5
(ServerResponseError), before any trainer forward runs; streams already answered stay on disk. An
answer without choices, or with logprobs of the wrong shape, is read as `nondet probe` reads it
(server/responses.py): the same exit 5 and the same words.
"""

from nondet.errors import ServerResponseError
from nondet.probes.core.chat import prompt_token_ids
from nondet.probes.core.source import Emit, Opened, Planned
from nondet.probes.rl.rollouts import EXTERNAL
from nondet.rundir.records import ConditionRecord, StepRecord, StreamRecord, Summary

CONDITION_ID = "external/server"
TOKEN_ID_PREFIX = "token_id:"  # vLLM's spelling of a token under return_tokens_as_token_ids


class RLServerSamplerSource:
    kind = "rl-server"

    def __init__(self, config, loaded, run_ids) -> None:
        self.config = config  # RLConfig with an endpoint
        self.loaded = loaded  # the trainer's model; its tokenizer turns prompts into the ids sent
        self.run_ids = run_ids
        self.prompt_ids: list[list[int]] = []

    def open(self) -> Opened:
        from nondet.probes.core.numerics import fingerprint

        tok = self.loaded.tokenizer
        self.prompt_ids = [prompt_token_ids(tok, p) for p in self.config.prompts]  # a Chat: its template's ids
        return Opened(fingerprint(self.loaded.description, f"{EXTERNAL} ({self.config.endpoint})"))

    def attach(self, writer) -> None:
        pass

    def plan(self) -> list[Planned]:
        return [Planned(CONDITION_ID, f"server sampler {self.config.endpoint}", EXTERNAL, None)]

    def replay(self, planned: Planned, emit: Emit) -> ConditionRecord:
        from nondet.probes.server.client import Client, ClientSettings

        client = Client(ClientSettings(self.config.endpoint))
        model = served_model(client)
        for i, ids in enumerate(self.prompt_ids):
            tokens, logprobs = sampled(client.post("/v1/completions", self._payload(i, ids, model)).body,
                                       client.url("/v1/completions"), self.config.endpoint)
            emit(StreamRecord(
                run_id=next(self.run_ids), condition_id=CONDITION_ID, kernels=EXTERNAL, position=None,
                is_reference=True, prompt_id=i, prompt_tokens=len(ids), finish="length",
                steps=[StepRecord(token=t, logprob=float(lp).hex()) for t, lp in zip(tokens, logprobs)],
                extra={"side": "sampler", "prompt_ids": list(ids)}))
        return ConditionRecord(condition_id=CONDITION_ID, kernels=EXTERNAL, batch_size=None, positions=None,
                               fillers="none", label="server sampler", load=self.kind,
                               extra={"side": "sampler", "endpoint": self.config.endpoint})

    def summarize(self, streams: list[dict]) -> Summary:
        return Summary(modes={})  # nondet rl's summary pairs both sides: nondet.rl.summary

    def close(self) -> None:
        pass

    def _payload(self, index: int, ids: list[int], model: str | None) -> dict:
        c = self.config
        body = {"prompt": list(ids), "max_tokens": c.max_new_tokens, "temperature": c.temperature,
                "top_p": c.top_p, "seed": c.seed + index, "logprobs": 1, "return_tokens_as_token_ids": True}
        if c.top_k:
            body["top_k"] = c.top_k  # vLLM's extension of the OpenAI API
        if model:
            body["model"] = model
        return body


def served_model(client) -> str | None:
    """The first model id /v1/models lists (the request names it); None when it lists none."""
    from nondet.probes.server.source import identify

    models = identify(client)["models"]
    return models[0] if models else None


def sampled(body: dict, where: str, endpoint: str) -> tuple[list[int], list[float]]:
    """(token ids, their logprobs) of a completion answer; ServerResponseError (exit 5) when unusable.
    where: the URL answered; an answer without choices[0].text or with malformed logprobs is refused as
    `nondet probe` refuses it (responses.py), not as one without logprobs, which it is not."""
    from nondet.probes.server.responses import parse_completion

    tokens = parse_completion(body, chat=False, where=where).tokens
    if not tokens or any(value is None for _piece, value, _top in tokens):
        raise ServerResponseError(f"the server at {endpoint} returned no logprobs: nondet rl needs the sampler's "
                                  "logprob of every sampled token (vLLM returns them; `transformers serve` does not)")
    return [_token_id(piece, endpoint) for piece, _value, _top in tokens], [value for _piece, value, _top in tokens]


def _token_id(token, endpoint: str) -> int:
    if isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX) and token[len(TOKEN_ID_PREFIX):].isdigit():
        return int(token[len(TOKEN_ID_PREFIX):])
    raise ServerResponseError(f"the server at {endpoint} returned tokens as text, not ids; nondet rl needs the "
                              "sampled ids (vLLM: return_tokens_as_token_ids)")
