"""transformers' KV-cache argument under its two names.

transformers 5.24 renamed the forward's `past_key_values` to `cache` (and the output field with it);
the old name is still accepted, with a deprecation warning, so nondet passes whichever name the
model's forward declares and reads whichever field its output has.
"""

import inspect


def cache_kwarg(model) -> str:
    """The keyword a model's forward takes its KV cache by: "cache" (5.24+) or "past_key_values"."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_cache(output):
    """The KV cache a forward returned (output.cache from 5.24, output.past_key_values before)."""
    fields = output.keys() if hasattr(output, "keys") else ()
    return output["cache"] if "cache" in fields else output.past_key_values
