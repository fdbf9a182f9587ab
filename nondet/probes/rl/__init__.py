"""The probe side of `nondet rl`: sampler and trainer computations of the same tokens.

    sampler.py        sampled completions, batched and left-padded (batched generate)
    continuous.py     the sampler under continuous batching (`--load continuous`)
    server.py         the sampler on a live server (`--endpoint URL`)
    rollouts.py       exported rollouts written as sampler streams (`--rollouts FILE`)
    trainer.py        teacher-forced forwards over prompt + completion, per micro-batch
    packed.py         several sequences packed in one row, as trainers pack them (refused where the model leaks)
    train_mode.py     the trainer's train-mode forward with nothing random left in it
    processed.py      the processed distribution both sides take logprobs over
    kl.py             exact per-token KL(sampler || trainer)
    bisect.py         `nondet bisect` of an rl run; bisect_replay.py its two-sided lockstep
nondet/rl (the command: config, run, summary) drives these sources. This package's __init__
imports nothing.
"""
