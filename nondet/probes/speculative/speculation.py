"""`--speculative` forms: how a speculative condition drafts tokens (torch-free, parsed early).

    ngram:K            prompt-lookup decoding: K tokens drafted from n-gram matches in the
                       context (transformers `prompt_lookup_num_tokens`); no draft model
    self:K             the target as its own draft (`assistant_model=target`): acceptance ~100%,
                       every token goes through the k+1 verification pass
    draft[:K]          the embedded draft (the embedded default's first layer, same tokenizer)
    draft:MODEL[:K]    a draft model (local directory or hub id), `assistant_model`
"""

from dataclasses import dataclass

from nondet.errors import UsageError

KINDS = ("ngram", "self", "draft")
DEFAULT_K = 4  # tokens drafted per verification round when a draft form gives none


@dataclass(frozen=True)
class Speculation:
    kind: str  # ngram | self | draft
    k: int  # tokens drafted per verification round (the verification pass has k+1 query rows)
    model: str | None = None  # draft: a model dir or hub id; None = the embedded draft

    @property
    def name(self) -> str:
        """The form as it is shown and stored: 'ngram:4', 'draft:4', 'draft:DIR:4'."""
        return ":".join([self.kind] + ([self.model] if self.model else []) + [str(self.k)])

    @property
    def slug(self) -> str:
        """Its part of a condition id: 'ngram4', 'self4', 'draft4' (a named draft: 'draft-<dir name>4')."""
        model = "" if not self.model else "-" + "".join(c if c.isalnum() else "_" for c in self.model.split("/")[-1])
        return f"{self.kind}{model}{self.k}"


def parse_speculative(text: str | None) -> tuple[Speculation, ...]:
    """'ngram:4,self:4,draft:DIR:2' -> Speculations; a one-line UsageError naming the bad form."""
    forms = [f.strip() for f in (text or "").split(",") if f.strip()]
    parsed = tuple(parse_form(f) for f in forms)
    names = [s.name for s in parsed]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise UsageError(f"--speculative: {duplicate!r} is given twice")
    return parsed


def parse_form(form: str) -> Speculation:
    kind, _, rest = form.partition(":")
    if kind not in KINDS:
        raise UsageError(f"--speculative: unknown form {form!r}; use ngram:K, self:K, draft[:K] or draft:MODEL[:K]")
    if kind == "draft":
        model, k = _draft_parts(rest)
        return Speculation(kind, _k(form, k), model)
    if not rest:
        raise UsageError(f"--speculative: {form!r} needs K, the tokens drafted per round, e.g. {kind}:4")
    return Speculation(kind, _k(form, rest))


def _draft_parts(rest: str) -> tuple[str | None, str]:
    """'' -> embedded, K default; '4' -> embedded, 4; 'DIR' -> DIR, default; 'DIR:4' -> DIR, 4."""
    head, sep, tail = rest.rpartition(":")
    if sep and tail.lstrip("-").isdigit():
        return head or None, tail
    if rest.lstrip("-").isdigit():
        return None, rest
    return rest or None, str(DEFAULT_K)


def _k(form: str, text: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise UsageError(f"--speculative: K in {form!r} is not an integer") from None
    if k < 1:
        raise UsageError(f"--speculative: K in {form!r} must be >= 1 (tokens drafted per verification round)")
    return k
