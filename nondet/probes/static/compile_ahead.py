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

Under `--cuda-graphs` nothing is traced: the second process compiles the mode's Triton binaries beside the
probe, which does not wait for it (kernels_ahead.py says how).
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
from nondet.probes.static import kernels_ahead

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
MARKED = "an earlier probe of this plan compiled its kernels (NONDET_CACHE/kernels-ahead)"
# the second process's module (a probes root module: it runs the static source with the probe's own loop)
PROCESS = "nondet.probes.ahead_process"


@dataclass
class Helper:
    """One second process: the kernels mode it compiles, its folder (its settings and log)."""

    mode: str
    process: subprocess.Popen
    folder: Path
    started: float  # time.time() when it was started (the clock FINISHED is written in: two processes read it)
    binaries: bool = False  # --cuda-graphs: it warms up the mode's shapes for their Triton binaries, not waited for
    beside: float | None = None  # time.time() when the probe began the mode with it still running (--cuda-graphs)


class CompileAhead:
    """The second processes of one probe: started after the model's load, or with it (start), waited for
    before their mode's first warm-up (wait), stopped and removed at the end (close)."""

    def __init__(self) -> None:
        self.helpers: dict[str, Helper] = {}
        self.outcomes: dict[str, str] = {}  # kernels mode -> what its second process did, in words
        self.decided = False  # start() decided whether second processes run (before or after the model's load)
        self.config = None  # the probe's ProbeConfig, from start()

    def start(self, config, model, in_memory: bool = False) -> None:
        """A second process per later kernels mode of `config` (a ProbeConfig), where it pays (why_not).
        in_memory: the probe was handed `model` (probe_model), which a second process cannot load. model None:
        before the probe loads it (--cuda-graphs: kernels_ahead.before_load); where that cannot be decided
        yet, the call after the load decides. Once decided, later calls do nothing."""
        if self.decided:
            return
        later = kernels_ahead.modes(config) if config.cuda_graphs else config.kernels[1:]
        self.config = config
        weights = None
        if model is None:
            weights = kernels_ahead.before_load(config)
            if weights is None:
                return
        self.decided = True
        reason = why_not(config, model, in_memory, weights) if later else "one kernels mode"
        if reason is not None:
            self.outcomes.update({mode: f"not started: {reason}" for mode in later})
            return
        if config.cuda_graphs:  # those whose binaries an earlier probe left (kernels_ahead.mark)
            marked = [mode for mode in later if kernels_ahead.is_marked(config, mode)]
            self.outcomes.update({mode: f"not started: {MARKED}" for mode in marked})
            later = [mode for mode in later if mode not in marked]
        for mode in later:
            folder = Path(tempfile.mkdtemp(prefix="nondet-ahead-"))
            argument = folder / SETTINGS
            settings = kernels_ahead.warm_up_config(config, mode) if config.cuda_graphs else helper_config(config, mode)
            argument.write_text(json.dumps(asdict(settings)))
            with open(folder / LOG, "wb") as log:
                process = subprocess.Popen(_command(argument), stdout=log, stderr=subprocess.STDOUT,
                                           env=_helper_env())
            self.helpers[mode] = Helper(mode, process, folder, time.time(), binaries=config.cuda_graphs)

    def waits_for(self, mode: str) -> bool:
        """Whether a second process of this mode's is still to be waited for (or stopped)."""
        return mode in self.helpers

    def wait(self, mode: str, cache_warm: bool) -> None:
        """Before the mode's first warm-up: wait for its second process, if any, and note what it did. Where
        the cache was warm for the earlier modes (their steps loaded, none compiled), it is stopped instead:
        this mode's step is most likely saved too, and the second process would only load it as well,
        later than this one (on an H200 a warm probe waited 10-15 s for it); where it is not saved after
        all, it is compiled here, as without a second process. A --cuda-graphs second process is not waited
        for (_beside)."""
        helper = self.helpers.get(mode)
        if helper is None or helper.beside is not None:
            return
        if helper.binaries:
            self._beside(helper)
            return
        del self.helpers[mode]
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

    def _beside(self, helper: Helper) -> None:
        """--cuda-graphs, the mode about to begin: not waited for. Where the second process is done, say so;
        else it goes on beside the mode (kernels_ahead.py) and close() says what it did."""
        code = helper.process.poll()
        if code is None:
            helper.beside = time.time()
            return
        del self.helpers[helper.mode]
        self.outcomes[helper.mode] = _binaries_outcome(helper, code, beside=None)
        shutil.rmtree(helper.folder, ignore_errors=True)

    def finished(self, modes: list[str]) -> None:
        """Every condition of these kernels modes ran on the CUDA-graph path: their binaries are in the cache,
        and a later probe of the same plan starts no second process for them (kernels_ahead.mark)."""
        if self.config is None or not self.config.cuda_graphs:
            return
        for mode in modes:
            if mode in kernels_ahead.modes(self.config):
                kernels_ahead.mark(self.config, mode)

    def close(self) -> None:
        """Stop every second process still running: one whose mode never began (the probe ended early: an
        error, Ctrl-C), or one that ran beside its mode (--cuda-graphs) and is done or no longer of use."""
        for helper in self.helpers.values():
            if helper.beside is None:
                _stop(helper)
                self.outcomes[helper.mode] = "stopped: the probe ended before its mode ran"
                continue
            code = helper.process.poll()
            self.outcomes[helper.mode] = _binaries_outcome(helper, code, helper.beside)
            _stop(helper)
        self.helpers.clear()

    def as_summary(self) -> dict:
        return dict(self.outcomes)


def why_not(config, model, in_memory: bool = False, weights: int | None = None) -> str | None:
    """Why no second process is started for this probe and model, or None where one is. model None: before the
    probe's load, `weights` the checkpoint's bytes (kernels_ahead.before_load)."""
    from nondet.probes.core import precompiled

    setting = os.environ.get(ENV)
    if setting == "0":
        return f"{ENV}=0"
    if in_memory:
        return "a model handed over in memory (a second process loads the model from disk)"
    if not config.cuda_graphs and not precompiled.enabled():
        return f"saved steps off ({precompiled.ENV}={os.environ.get(precompiled.ENV)})"
    if config.prefill or config.speculative or config.tp:
        return "the compiled step of another axis"
    if setting == "1":
        return None
    device = model.device if model is not None else kernels_ahead.configured_device(config)
    if device.type != "cuda":
        return f"a {device.type} device (the two compiles share its cores)"
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
    if helper.process.poll() is None:
        helper.process.terminate()
        try:
            helper.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            helper.process.kill()
            helper.process.wait()
    shutil.rmtree(helper.folder, ignore_errors=True)


def _binaries_outcome(helper: Helper, code: int | None, beside: float | None) -> str:
    return kernels_ahead.outcome(helper.started, _finished(helper), code, beside,
                                 _last_line(helper) if code else "")


def _finished(helper: Helper) -> float | None:
    """Seconds from the second process's start to its end, where it wrote FINISHED (it ended well)."""
    try:
        return float((helper.folder / FINISHED).read_text()) - helper.started
    except (OSError, ValueError):
        return None


def _last_line(helper: Helper) -> str:
    lines = (helper.folder / LOG).read_text(errors="replace").strip().splitlines()
    return lines[-1][:160] if lines else "no output"
