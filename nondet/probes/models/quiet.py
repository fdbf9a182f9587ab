"""transformers' own progress bars off for a scope ("Loading weights", "Writing model shards"): the probe's bar
is the only one on screen, and an error line is the only line of a failed command. Restored on exit."""

import contextlib


@contextlib.contextmanager
def no_hf_progress_bars():
    from transformers.utils import logging as hf_logging

    were_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if were_enabled:
            hf_logging.enable_progress_bar()
