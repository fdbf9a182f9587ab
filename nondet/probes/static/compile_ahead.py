"""A later kernels mode's decode step compiled by a second process while the probe runs the first mode.

A cold `probe --compile --confirm` is mostly tracing and compiling, one function after another: dynamo
and AOT autograd are Python on one thread. On an H200 (the GPU probe case, 2026-11-29) the default
kernels' two functions took 60-85 s, then the mode's one 32-45 s. Where the host has cores to spare, a
second process started after the model's load runs the probe's own code for each later mode's first
condition (the prompt alone at batch 1: the same model, compile config and saved step's key,
core/step_key.py) and so compiles and saves that mode's step under NONDET_CACHE (core/precompiled.py)
while this process compiles and decodes the first mode. Before the later mode's first warm-up the probe
waits for that process, then loads the step and traces nothing (where it is a function for every batch
size: a class torch's guards keep apart is still compiled here, core/precompiled.py). Where the earlier
modes' steps were loaded (a warm cache), the second process is stopped rather than waited for
(CompileAhead.wait). The function loaded is the graph the second process compiled from the same inputs;
the tests compare the streams with a run that compiled it in process.

On where it pays: a CUDA device, MIN_CORES cores or more, and free GPU memory for MEMORY_FACTOR times the
weights (the second process holds its own copy while it compiles). NONDET_COMPILE_AHEAD=0 turns it off;
=1 turns it on wherever the saved steps are used, a CPU included (the tests; on a 2-core CPU the two
compiles share the cores and the gain was 4%: docs/benchmarks.md). A second process that fails, or has
not finished after WAIT_S, leaves the mode to compile here, as without it; summary.json's decode_path
"compiled_ahead" says per mode what happened.

Where the probe decodes eagerly or from CUDA graphs nothing is traced: the second process decodes the mode's
conditions beside the probe instead, from the plan's other end (decode_ahead.py); it starts with the model's
load, and the probe takes its rows (rows).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from nondet.probes.core.child_process import usable_cores
from nondet.probes.static import decode_ahead, rows_ahead

ENV = "NONDET_COMPILE_AHEAD"
MIN_CORES = 8  # an H200 host has 16; on a 2-core CPU a cold probe gained 0-3% (docs/benchmarks.md, 2026-11-29)
MEMORY_FACTOR = 4  # free GPU memory / the weights' bytes: the second copy, its cache and graphs, and the
# room this process's larger batches still need while the second process runs
WAIT_S = 900.0  # the longest the probe waits for a second process before it compiles the mode itself
LOG = "compile-ahead.log"  # the second process's output, in its folder (the last line says why it failed)
SETTINGS = "probe-settings.json"  # the second process's ProbeConfig (asdict), in its folder
# the second process's time.time() when it ended well, in its folder: the probe often reaches the mode after the
# second process is done, so the time until the wait ends would overstate the compile (by 34 s on a 2-core CPU)
FINISHED = "finished"
# the second process's module (a probes root module: it runs the static source with the probe's own loop)
PROCESS = "nondet.probes.ahead_process"
POLL_S = 0.01  # how often the probe looks for rows a decoding second process has not written yet
ROWS_WAIT_S = WAIT_S  # the longest the probe waits for one condition's rows before it stops that process
# tests set False: the probe never claims a condition of a decoding second process's mode while that process
# runs, so it decodes them all whatever its start-up time (a tiny model's sweep ends before it loads)
PROBE_CLAIMS = True


@dataclass
class Helper:
    """One second process: the kernels mode it compiles or decodes, its folder (its settings, log and rows)."""

    mode: str
    process: subprocess.Popen
    folder: Path
    started: float  # time.time() when it was started (the clock FINISHED is written in: two processes read it)
    decodes: bool = False  # it decodes the mode's conditions (decode_ahead.py) rather than compiling its step
    taken: int = 0  # conditions whose rows the probe took from it
    here: int = 0  # conditions of its mode the probe decoded itself
    waited: float = 0.0  # seconds the probe waited for its rows
    stalled: bool = False  # it gave no rows for ROWS_WAIT_S and was stopped (a hung process must not hang the probe)


class CompileAhead:
    """The second processes of one probe: started after the model's load, or with it (start); a compiling
    one waited for before its mode's first warm-up (wait), a decoding one asked for its rows (rows); stopped
    and removed at the end (close)."""

    def __init__(self) -> None:
        self.helpers: dict[str, Helper] = {}
        self.outcomes: dict[str, str] = {}  # kernels mode -> what its second process did, in words
        self.decided = False  # start() decided whether second processes run (before or after the model's load)

    def start(self, config, model, in_memory: bool = False) -> None:
        """A second process per later kernels mode of `config` (a ProbeConfig), where it pays (why_not).
        in_memory: the probe was handed `model` (probe_model), which a second process cannot load. model None:
        before the probe loads it (a decoding second process: decode_ahead.before_load); where that cannot be
        decided yet, the call after the load decides. Once decided, later calls do nothing."""
        if self.decided:
            return
        decodes = not config.compile_backend
        later = decode_ahead.modes(config) if decodes else config.kernels[1:]
        weights = None
        if model is None:
            weights = decode_ahead.before_load(config)
            if weights is None:
                return
        self.decided = True
        reason = why_not(config, model, in_memory, weights) if later else "one kernels mode"
        if reason is not None:
            self.outcomes.update({mode: f"not started: {reason}" for mode in later})
            return
        for mode in later:
            folder = Path(tempfile.mkdtemp(prefix="nondet-ahead-"))
            argument = folder / SETTINGS
            settings = decode_ahead.helper_config(config, mode) if decodes else helper_config(config, mode)
            argument.write_text(json.dumps(asdict(settings)))
            if decodes:
                rows_ahead.prepare(folder)
            with open(folder / LOG, "wb") as log:
                process = subprocess.Popen(_command(argument), stdout=log, stderr=subprocess.STDOUT,
                                           env=_helper_env())
            self.helpers[mode] = Helper(mode, process, folder, time.time(), decodes=decodes)

    def waits_for(self, mode: str) -> bool:
        """Whether a compiling second process of this mode's is still to be waited for (or stopped)."""
        helper = self.helpers.get(mode)
        return helper is not None and not helper.decodes

    def rows(self, mode: str, condition_id: str, decode_here) -> dict[int, list[dict]]:
        """A condition's rows: decoded here by decode_here() where no second process decodes its mode or the
        probe claims it first; else the second process's, waited for. Where that process is gone without
        them (it failed, or was killed), decoded here after all."""
        helper = self.helpers.get(mode)
        if helper is None or not helper.decodes:
            return decode_here()
        if PROBE_CLAIMS and rows_ahead.claim(helper.folder, condition_id):
            helper.here += 1
            return decode_here()
        rows = _wait_for_rows(helper, condition_id)
        if rows is None:
            helper.here += 1
            return decode_here()
        helper.taken += 1
        return rows

    def wait(self, mode: str, cache_warm: bool) -> None:
        """Before the mode's first warm-up: wait for its second process, if any, and note what it did. Where
        the cache was warm for the earlier modes (their steps loaded, none compiled), it is stopped instead:
        this mode's step is most likely saved too, and the second process would only load it as well,
        later than this one (on an H200 a warm probe waited 10-15 s for it); where it is not saved after
        all, it is compiled here, as without a second process."""
        if not self.waits_for(mode):
            return
        helper = self.helpers.pop(mode)
        if cache_warm:
            _stop(helper)
            self.outcomes[mode] = "stopped: the earlier kernels modes' steps were loaded (a warm cache)"
            return
        waited = time.time()
        try:
            code = helper.process.wait(timeout=max(0.0, WAIT_S - (waited - helper.started)))
        except subprocess.TimeoutExpired:
            self.outcomes[mode] = f"stopped after {WAIT_S:.0f} s unfinished: compiled here"
            _stop(helper)
            return
        held = time.time() - waited
        took = _finished(helper) or time.time() - helper.started
        if code == 0:
            self.outcomes[mode] = f"compiled by a second process in {took:.1f} s (waited for {held:.1f} s)"
        else:
            self.outcomes[mode] = f"second process failed (exit {code}: {_last_line(helper)}): compiled here"
        shutil.rmtree(helper.folder, ignore_errors=True)

    def close(self) -> None:
        """Stop every second process still running and say what each did: a compiling one whose mode never
        began (the probe ended early: an error, Ctrl-C); a decoding one, done or no longer of use."""
        for helper in self.helpers.values():
            if helper.decodes and helper.taken + helper.here:
                code = helper.process.poll()
                self.outcomes[helper.mode] = decode_ahead.outcome(
                    helper.taken, helper.here, helper.waited, _finished(helper), code,
                    _last_line(helper) if code else "", ROWS_WAIT_S if helper.stalled else None)
            else:
                self.outcomes[helper.mode] = "stopped: the probe ended before its mode ran"
            _stop(helper)
        self.helpers.clear()

    def as_summary(self) -> dict:
        return dict(self.outcomes)


def decodes_ahead(config) -> bool:
    """Whether the probe may start a decoding second process (why_not then decides): static batches decoded
    eagerly or from CUDA graphs, a mode one decodes (decode_ahead.modes), on a CUDA device, or anywhere where
    NONDET_COMPILE_AHEAD=1 asks for one (the tests, on a CPU). --compile's compiles its step instead; with
    --fail-fast the batches need their references, which are decoded here."""
    if config.compile_backend or config.fail_fast or not decode_ahead.modes(config):
        return False
    return str(config.model.device).startswith("cuda") or os.environ.get(ENV) == "1"


def why_not(config, model, in_memory: bool = False, weights: int | None = None) -> str | None:
    """Why no second process is started for this probe and model, or None where one is. model None: before the
    probe's load, `weights` the checkpoint's bytes (decode_ahead.before_load)."""
    from nondet.probes.core import precompiled

    setting = os.environ.get(ENV)
    if setting == "0":
        return f"{ENV}=0"
    if in_memory:
        return "a model handed over in memory (a second process loads the model from disk)"
    if config.compile_backend and not precompiled.enabled():
        return f"saved steps off ({precompiled.ENV}={os.environ.get(precompiled.ENV)})"
    if config.prefill or config.speculative or config.tp or config.load.mode != "static":
        return "the compiled step of another axis"
    if config.workers != 1 or config.budget is not None:
        return "--workers / --budget plan the conditions' processes themselves"
    if setting == "1":
        return None
    device = model.device if model is not None else decode_ahead.configured_device(config)
    if device.type != "cuda":
        return f"a {device.type} device (the two processes would share its cores)"
    cores = usable_cores()
    if cores < MIN_CORES:
        return f"{cores} cores (fewer than {MIN_CORES})"
    if model is not None:
        return _memory_short(device, sum(p.numel() * p.element_size() for p in model.parameters()), MEMORY_FACTOR)
    return _memory_short(device, weights, MEMORY_FACTOR + 1)  # this process's own copy is still to come


def _memory_short(device, weights: int, copies: int) -> str | None:
    """Why the GPU cannot hold `copies` times the weights' bytes (the second copy and the room this process
    still needs), or None."""
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    if free < copies * weights:
        return f"{free / 2**30:.1f} GiB free on the GPU, under {copies} x the weights' {weights / 2**30:.1f} GiB"
    return None


def helper_config(config, mode: str):
    """The second process's probe: the first prompt alone at batch 1 under `mode`, the rest as configured
    (model, compile backend, token count, chat formatting, threads: what the saved step's key and shapes
    read); no run directory."""
    return replace(config, prompt=config.targets[0], prompts=(), batch_sizes=(1,), placement="auto", runs=None,
                   trials=1, ragged=False, kernels=(mode,), out=None, argv=())


def _command(argument: Path) -> list[str]:
    return [sys.executable, "-m", PROCESS, str(argument)]


def _helper_env() -> dict:
    """This process's environment (NONDET_CACHE, the device's settings), nondet importable from where this
    process imported it, and no second processes of its own."""
    import nondet

    here = str(Path(nondet.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, ENV: "0"}


def _stop(helper: Helper) -> None:
    _end(helper.process)
    shutil.rmtree(helper.folder, ignore_errors=True)


def _end(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s; reaped."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_for_rows(helper: Helper, condition_id: str) -> dict[int, list[dict]] | None:
    """The rows of a condition the second process claimed, once written; None where it ended without them, or
    gave none for ROWS_WAIT_S (it is stopped: the rest are the probe's)."""
    waited = time.time()
    try:
        while (rows := rows_ahead.take(helper.folder, condition_id)) is None:
            if helper.process.poll() is not None:
                return rows_ahead.take(helper.folder, condition_id)  # written just before it ended
            if time.time() - waited > ROWS_WAIT_S:
                helper.stalled = True
                _end(helper.process)
                continue  # ended now: its rows, where it wrote them at the last moment, else None
            time.sleep(POLL_S)
        return rows
    finally:
        helper.waited += time.time() - waited


def _finished(helper: Helper) -> float | None:
    """Seconds from the second process's start to its end, where it wrote FINISHED (it ended well)."""
    try:
        return float((helper.folder / FINISHED).read_text()) - helper.started
    except (OSError, ValueError):
        return None


def _last_line(helper: Helper) -> str:
    lines = (helper.folder / LOG).read_text(errors="replace").strip().splitlines()
    return lines[-1][:160] if lines else "no output"
