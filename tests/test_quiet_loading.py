"""models/quiet.py: the hub's retry warnings and transformers' bars are off inside, as they were after."""

import logging

from transformers.utils import logging as hf_logging

from nondet.probes.models.quiet import quiet_loading


def test_hub_warnings_and_progress_bars_are_off_inside_and_restored(capsys):
    retry = logging.getLogger("huggingface_hub.utils._http")
    handler = logging.StreamHandler()  # to stderr, as huggingface_hub's own
    retry.addHandler(handler)
    try:
        with quiet_loading():
            retry.warning("Retrying in 1s [Retry 1/5].")
            assert not hf_logging.is_progress_bar_enabled()
        assert capsys.readouterr().err == ""
        retry.warning("Retrying in 2s [Retry 2/5].")  # the control: outside, it shows
        assert "Retrying in 2s" in capsys.readouterr().err
        assert hf_logging.is_progress_bar_enabled()
    finally:
        retry.removeHandler(handler)
