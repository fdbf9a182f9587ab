"""The report's "Speculative decoding" section: each form against plain greedy (summary.json's
"speculative" section, written by the speculative source). Absent for other probes."""

from nondet.fmt import fmt_fixed, fmt_percent, fmt_step, fmt_times
from nondet.reports.blocks import Para, Section, Table
from nondet.reports.tables import RunTables
from nondet.verdict import undrafted_line

HEADER = ["kernels", "form", "prompts", "distinct vs plain", "prompts diverged", "first token divergence",
          "first numeric divergence", "acceptance", "tokens/s speculative", "tokens/s plain", "speedup",
          "tokens per round", "round cost (plain steps)"]


def speculative_sections(t: RunTables) -> list[Section]:
    section = t.summary.get("speculative")
    if not section:
        return []
    rows = [[f["kernels"], f["speculative"], fmt_step(f["n_prompts"]), fmt_step(f["distinct_completions"]),
             f"{f['prompts_diverged']} of {f['n_prompts']}", fmt_step(f["first_token_divergence"]),
             fmt_step(f["first_numeric_divergence"]), fmt_percent(f.get("acceptance_rate")),
             fmt_fixed(f.get("tokens_per_s")), fmt_fixed(f.get("reference_tokens_per_s")), fmt_times(f.get("speedup")),
             fmt_fixed(f.get("tokens_per_round"), 2), fmt_fixed(f.get("round_cost"), 2)]
            for f in section.get("by_form", [])]
    note = Para(["Each form decodes every prompt alone (batch size 1) with speculative decoding and is compared "
                 "with plain greedy decoding of the same prompt under the same kernels. Distinct vs plain: 1 when "
                 "the tokens are the same on every prompt. Acceptance: drafted tokens the target kept. The target "
                 "verifies k drafted tokens in one pass of k+1 query rows where plain decoding runs one row: any "
                 "numeric divergence here is that axis. Tokens/s are wall-clock on this run's device. Speedup = "
                 "tokens per round / round cost, a round's time (its drafts included) in plain greedy steps: the "
                 "kernels modes decode different streams, so compare their round costs for the kernels' price "
                 "alone."], kind="note")
    undrafted = [Para([line], kind="note") for line in filter(None, map(undrafted_line, section.get("by_form", [])))]
    return [Section("Speculative decoding", "speculative",
                    [Table(HEADER, rows, [False, False] + [True] * 11), *undrafted, note])]
