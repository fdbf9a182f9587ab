"""True on-policy RL: sampler vs trainer logprobs of the same sampled tokens.

`compare` is the library API for training loops (numpy only, imports no torch). `nondet rl`
(nondet/cli/rl.py) runs both sides on a model: nondet.rl.run.
"""

from nondet.rl.compare import compare

__all__ = ["compare"]
