"""Which serving engine a server is, from what it says about itself.

A server's answer to /v1/models (source.py `identify`: the models' owners, the response
headers) names an engine when it carries one of these marks; any other server is unrecognized
(None):

    llama.cpp server    the `Server: llama.cpp` header, or models owned by "llamacpp" (`llama-server`)
    llama-cpp-python    models owned by "me" (`python -m llama_cpp.server`)
    vLLM                models owned by "vllm"
    SGLang              models owned by "sglang"
    transformers serve  none of those, and uvicorn answering with an `x-request-id` header (its
                        middleware sets one on every answer, /v1/models included)

`--against` uses it to tell two deployments of one engine from two engines: two engines run
different kernels (and often other weight formats), so their answers differ from the first
steps for reasons that have nothing to do with batching.
"""

OWNERS = {"llamacpp": "llama.cpp server", "me": "llama-cpp-python", "vllm": "vLLM", "sglang": "SGLang"}


def engine_of(owned_by: list[str], headers: dict[str, str]) -> str | None:
    """The engine's name from /v1/models' owners and its answer's headers (lower-case names, as
    sent), or None when the server carries no mark this module knows."""
    if "llama.cpp" in headers.get("server", ""):
        return "llama.cpp server"
    owner = next((OWNERS[o] for o in owned_by if o in OWNERS), None)
    if owner is None and headers.get("server") == "uvicorn" and "x-request-id" in headers:
        return "transformers serve"
    return owner


def different_engines(a: str | None, b: str | None) -> bool:
    """Two engines for sure: both named and different, or one named and the other not (a server
    that carries no mark of the named engine is not that engine)."""
    return a != b and (a is not None or b is not None)
