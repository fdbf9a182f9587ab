"""A stopping criterion that ends a generate call after a number of new tokens, whatever its max_new_tokens.

A static KV cache holds prompt + max_new_tokens positions, and attention spans every position under a mask, so
its length can be part of the numbers (how a kernel splits its sums may follow it). A call that must
decode fewer steps than the run it repeats (a compiled warm-up, bisect's replay up to the flip) therefore keeps
the run's max_new_tokens, so its cache has the run's length, and stops early with this criterion.
"""


def stop_after(prompt_tokens: int, steps: int):
    """Ends the call once every row holds prompt_tokens + steps tokens (rows share one length in generate)."""
    import torch
    from transformers import StoppingCriteria

    class StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            done = input_ids.shape[-1] >= prompt_tokens + steps
            return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

    return StopAfter()
