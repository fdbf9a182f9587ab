"""Teacher-forced agreement of a target and its draft, under default kernels and under the mode.

    python scripts/speculative_agreement.py --target DIR [--draft DIR] [--device cuda]

Speculative acceptance measured on a decode depends on the greedy stream each kernels mode
produces (two modes decode different streams). This takes the streams out: random token
sequences, one forward each, and the fraction of positions where the target's and the draft's
argmax agree, for default kernels, the mode on the target with the draft on its own attention
(how drafts ran under the mode before 2026-11-26), and the mode on both. Default --draft: DIR-draft
(what bench_speculative.py --damp builds).
"""

import argparse

import torch
from transformers import AutoModelForCausalLM

from nondet.kernels import batch_invariant


def main() -> None:
    args = _parse()
    target = _load(args.target, args.device)
    draft = _load(args.draft or args.target.rstrip("/") + "-draft", args.device)
    generator = torch.Generator().manual_seed(0)
    sequences = torch.randint(0, target.config.vocab_size, (args.sequences, args.length), generator=generator)
    sequences = sequences.to(args.device)
    default = _agreement(target, draft, sequences)
    with batch_invariant(model=target):
        own_attention = _agreement(target, draft, sequences)
        with batch_invariant(model=draft):
            both = _agreement(target, draft, sequences)
    print("| positions | default kernels | mode, draft on its own attention | mode on both |")
    print("| ---: | ---: | ---: | ---: |")
    print(f"| {sequences.numel()} | {default:.4f} | {own_attention:.4f} | {both:.4f} |")


def _load(path: str, device: str):
    return AutoModelForCausalLM.from_pretrained(path, dtype="auto").to(device).eval()


def _agreement(target, draft, sequences) -> float:
    """Fraction of positions where the two models' greedy next tokens agree."""
    with torch.no_grad():
        agree = [(_argmax(target, s) == _argmax(draft, s)).float().mean() for s in sequences]
    return float(torch.stack(agree).mean())


def _argmax(model, sequence):
    return model(input_ids=sequence[None]).logits[0].float().argmax(-1)


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="the target model's directory")
    p.add_argument("--draft", help="the draft's directory (default: TARGET-draft)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--sequences", type=int, default=8)
    p.add_argument("--length", type=int, default=96)
    return p.parse_args()


if __name__ == "__main__":
    main()
