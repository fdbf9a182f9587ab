"""The report's "Speculative decoding" section: each form against plain greedy (summary.json's
"speculative" section, written by the speculative source). Absent for other probes."""

from nondet.fmt import DASH, fmt_step
from nondet.reports.blocks import Para, Section, Table
from nondet.reports.tables import RunTables

HEADER = ["kernels", "form", "prompts", "distinct vs plain", "prompts diverged", "first token divergence",
          "first numeric divergence", "acceptance", "tokens/s speculative", "tokens/s plain", "speedup"]


def speculative_sections(t: RunTables) -> list[Section]:
    section = t.summary.get("speculative")
    if not section:
        return []
    rows = [[f["kernels"], f["speculative"], fmt_step(f["n_prompts"]), fmt_step(f["distinct_completions"]),
             f"{f['prompts_diverged']} of {f['n_prompts']}", fmt_step(f["first_token_divergence"]),
             fmt_step(f["first_numeric_divergence"]), _percent(f.get("acceptance_rate")),
             _number(f.get("tokens_per_s")), _number(f.get("reference_tokens_per_s")), _times(f.get("speedup"))]
            for f in section.get("by_form", [])]
    note = Para(["Each form decodes every prompt alone (batch size 1) with speculative decoding and is compared "
                 "with plain greedy decoding of the same prompt under the same kernels. Distinct vs plain: 1 when "
                 "the tokens are the same on every prompt. Acceptance: drafted tokens the target kept. The target "
                 "verifies k drafted tokens in one pass of k+1 query rows where plain decoding runs one row: any "
                 "numeric divergence here is that axis. Tokens/s are wall-clock on this run's device."], kind="note")
    return [Section("Speculative decoding", "speculative", [Table(HEADER, rows, [False, False] + [True] * 9), note])]


def _percent(v) -> str:
    return DASH if v is None else f"{100 * v:.1f}%"


def _number(v) -> str:
    return DASH if v is None else f"{v:.1f}"


def _times(v) -> str:
    return DASH if v is None else f"{v:.2f}x"
