"""Two run directories compared stream by stream, bit for bit: one fleet, one answer.

Streams are paired by (condition, row, prompt, occurrence); every step's token and logprob bits
(float.hex as recorded) are compared. The two fingerprints are compared too, on the settings that
can move bits, so a verdict says what it spans (an H100 and an H200) or what to look at when it
fails (another CPU instruction set), and the two probe configs, on the settings that decide which
streams exist (a run of 6 tokens against one of 8). Reads files only: no torch.
"""

from collections import Counter
from dataclasses import dataclass

from nondet.rundir.files import CONDITIONS, RunDir
from nondet.rundir.reader import (has_header, read_conditions, read_fingerprint, read_header, read_streams,
                                  read_summary, require_finished)

# fingerprint.json settings that can change a stream's bits. Threads are left out: the mode's bits do
# not follow them, and the default kernels' differences are what a comparison is there to find.
NUMERIC_SETTINGS = ("device", "cpu_capability", "torch", "triton", "transformers", "cuda", "dtype", "kernels",
                    "kernel_tuning", "decode_path")


# config.json settings that decide which streams a probe writes: runs that differ in one pair few or no
# streams (the model is left out: the same weights sit in other directories on other machines)
PROBE_SETTINGS = ("prompt", "prompts", "batch_sizes", "placement", "runs", "fillers", "ragged", "max_new_tokens",
                  "temperature", "seed", "speculative", "tp", "kv_cache", "compile_backend", "cuda_graphs", "chat", "system")


@dataclass(frozen=True)
class Comparison:
    differing: list[str]  # one line per stream that differs or has no twin
    equal: int  # streams of A bitwise equal to their twin in B
    total: int  # streams of A
    environment: list[str]  # "setting: A | B" where the fingerprints differ (NUMERIC_SETTINGS, the model's shape)
    probe: list[str]  # the same for PROBE_SETTINGS in the two config.json files

    @property
    def identical(self) -> bool:
        return self.total > 0 and not self.differing

    def lines(self) -> list[str]:
        """What `nondet compare` prints: the probe and environment settings that differ (a line each, where
        any), the differing streams, the verdict."""
        head = ["probe settings differ in " + "; ".join(self.probe)] if self.probe else []
        head += ["environments differ in " + "; ".join(self.environment)] if self.environment else []
        return head + self.differing + [f"{self.equal} of {self.total} streams bitwise equal"]


def compare_runs(run_a: str, run_b: str) -> Comparison:
    """RunDirError (exit 4, never "differs") for a run that is missing, unfinished, torn or malformed."""
    for run in (run_a, run_b):
        _require_whole(RunDir(run))
    a, b = _keyed(run_a), _keyed(run_b)
    differing, equal = [], 0
    for key, steps in a.items():
        other = b.get(key)
        if other is None:
            differing.append(f"{_name(key)}: not in {run_b}")
            continue
        token, bits = _first(steps, other, "token"), _first(steps, other, "logprob")
        if token is None and bits is None:
            equal += 1
        else:
            differing.append(f"{_name(key)}: first token divergence {token}, first logprob-bits divergence {bits}")
    differing += [f"{_name(k)}: not in {run_a}" for k in b if k not in a]
    return Comparison(differing, equal, len(a), environment_differences(run_a, run_b),
                      probe_differences(run_a, run_b))


def _require_whole(rd: RunDir) -> None:
    """Finished, and every file a verdict rests on whole: summary.json read and checked (a cut-off one is a
    damaged run, not an "equal" one), conditions.jsonl without a torn record (streams: in _keyed)."""
    require_finished(rd)
    read_summary(rd)
    if rd.exists(CONDITIONS):
        read_conditions(rd, whole=True)


def environment_differences(run_a: str, run_b: str) -> list[str]:
    """'setting: A | B' for each NUMERIC_SETTINGS entry the two fingerprints disagree on, and the model's
    shape where it differs (none when either run has no fingerprint.json)."""
    fa, fb = (read_fingerprint(RunDir(run)) or {} for run in (run_a, run_b))
    if not fa or not fb:
        return []
    found = [f"{key}: {fa.get(key)} | {fb.get(key)}" for key in NUMERIC_SETTINGS if fa.get(key) != fb.get(key)]
    shape_a, shape_b = _model_shape(fa), _model_shape(fb)
    return found + ([f"model: {shape_a} | {shape_b}"] if shape_a != shape_b else [])


def _model_shape(fingerprint: dict) -> str:
    """The model as the fingerprint describes it, its directory left out (the same weights live in other
    directories on other machines): architecture, layers, hidden, vocab, parameters."""
    model = fingerprint.get("model") or {}
    return " ".join(str(model.get(k)) for k in ("architecture", "layers", "hidden", "vocab", "params"))


def probe_differences(run_a: str, run_b: str) -> list[str]:
    """'setting: A | B' for each PROBE_SETTINGS entry the two probe configs disagree on ('setting
    (differs)' where the values are too long for a line: prompt lists, fillers); none when either run
    has no config.json."""
    ca, cb = (_probe_config(RunDir(run)) for run in (run_a, run_b))
    if not ca or not cb:
        return []
    return [_difference(key, ca.get(key), cb.get(key)) for key in PROBE_SETTINGS if ca.get(key) != cb.get(key)]


def _probe_config(rd: RunDir) -> dict:
    """The command's config from config.json (read_header: shape and format version checked); {} without one."""
    return read_header(rd).config if has_header(rd) else {}


def _difference(key: str, a, b) -> str:
    text = f"{key}: {a} | {b}"
    return text if len(text) <= 100 else f"{key} (differs)"


def _keyed(run: str) -> dict[tuple, list]:
    """(condition_id, position, prompt_id, n-th such stream) -> steps."""
    seen: Counter = Counter()
    out = {}
    for s in read_streams(RunDir(run), whole=True):  # a torn record would read as a stream with no twin
        base = (s.condition_id, s.position, s.prompt_id)
        out[(*base, seen[base])] = s.steps
        seen[base] += 1
    return out


def _name(key: tuple) -> str:
    return f"{key[0]} row {key[1]} prompt {key[2]}"


def _first(a: list, b: list, field: str) -> int | None:
    """The first StepRecord whose `field` differs (a length difference counts at the shorter end)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if getattr(x, field) != getattr(y, field):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
