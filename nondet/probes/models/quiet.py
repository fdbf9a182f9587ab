"""The libraries' own chatter off while a model loads or is built: transformers' progress bars ("Loading
weights", "Writing model shards") and warnings (its load report, "model of type X", config checks), and
huggingface_hub's retry warnings (ten "Retrying in Ns" lines before an unreachable hub's one error line).
The probe's bar is the only one on screen, and a failed command's error line its only line: what matters
of those warnings is checked here and said in one line (load_checks.check_weights_loaded: parameters the
checkpoint lacks). NONDET_DEBUG=1 keeps the warnings. Everything restored on exit."""

import contextlib
import logging

from nondet.errors import debug_enabled


@contextlib.contextmanager
def quiet_loading():
    from transformers.utils import logging as hf_logging

    bars_were_enabled = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hub = logging.getLogger("huggingface_hub")
    hub_level = hub.level
    hf_logging.disable_progress_bar()
    if not debug_enabled():
        hf_logging.set_verbosity_error()
    hub.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub.setLevel(hub_level)
        hf_logging.set_verbosity(verbosity)
        if bars_were_enabled:
            hf_logging.enable_progress_bar()
