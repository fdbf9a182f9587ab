"""The libraries' own chatter off while a model loads or is built: transformers' progress bars ("Loading
weights", "Writing model shards") and huggingface_hub's retry warnings (ten "Retrying in Ns" lines before
an unreachable hub's one error line). The probe's bar is the only one on screen, and a failed command's
error line its only line. Both restored on exit."""

import contextlib
import logging


@contextlib.contextmanager
def quiet_loading():
    from transformers.utils import logging as hf_logging

    bars_were_enabled = hf_logging.is_progress_bar_enabled()
    hub = logging.getLogger("huggingface_hub")
    hub_level = hub.level
    hf_logging.disable_progress_bar()
    hub.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub.setLevel(hub_level)
        if bars_were_enabled:
            hf_logging.enable_progress_bar()
