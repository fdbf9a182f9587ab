"""The model-family matrix on CUDA (the Triton kernels): per family and dtype, is a row alone equal to
the same row in a batch of 4 under the mode (24 greedy steps, logits bitwise), how far the mode's
prefill is from the default kernels', does the positive control fire, and do default kernels alone
already differ (the variance the mode removes). A family the mode refuses (family_models.REFUSED)
gets its one-line refusal instead. The same models and checks as tests/test_family_matrix.py
(tests/family_models.py), every family in fp32 and bf16.

    python3 scripts/device/gpu_family_matrix.py [FAMILY...]
"""

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import family_models as fm  # noqa: E402

from nondet.kernels import batch_invariant  # noqa: E402
from nondet.kernels.coverage import UnsupportedModel  # noqa: E402


def row(name: str, directory: str, dtype: torch.dtype) -> str:
    model = fm.load(directory, dtype, "cuda")
    ids = fm.prompts()
    try:
        with batch_invariant(model=model):
            pass
    except UnsupportedModel as exc:
        expected = "as expected" if name in fm.REFUSED else "UNEXPECTED"
        return f"| {name} | {str(dtype)[6:]} | refused ({expected}): {exc} | | | | |"

    def mode():
        return batch_invariant(model=model)

    started = time.perf_counter()
    default = fm.invariance(model, ids, lambda: torch.no_grad())
    invariant = fm.invariance(model, ids, mode)
    error = fm.prefill_error(model, ids, mode)
    with fm.batch_variance(model):
        control = fm.invariance(model, ids, mode)
    seconds = time.perf_counter() - started
    return (f"| {name} | {str(dtype)[6:]} | {_step(default)} | {'yes' if invariant is None else 'NO: step ' + str(invariant)}"
            f" | {error:.1e} | {'fired at ' + str(control) if control is not None else 'DID NOT FIRE'} | {seconds:.1f} |")


def _step(step):
    return "identical" if step is None else f"step {step}"


def main() -> None:
    import transformers
    import triton

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"transformers {transformers.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| family | dtype | default kernels: alone vs batch of 4 | mode: invariant | mode prefill vs default "
          "(rel.) | positive control | s |")
    print("| --- | --- | --- | --- | ---: | --- | ---: |")
    root = Path(tempfile.mkdtemp())
    for name in sys.argv[1:] or fm.ALL_FAMILIES:
        try:
            directory = fm.save_family(name, root / name)
        except (AttributeError, ValueError, TypeError) as exc:  # a family this transformers lacks
            print(f"| {name} | - | not built here: {type(exc).__name__}: {str(exc)[:80]} | | | | |")
            continue
        for dtype in (torch.float32, torch.bfloat16):
            try:
                print(row(name, directory, dtype), flush=True)
            except Exception as exc:  # noqa: BLE001 - one family's failure must not hide the others
                print(f"| {name} | {str(dtype)[6:]} | ERROR {type(exc).__name__}: {str(exc)[:120]} | | | | |", flush=True)


if __name__ == "__main__":
    main()
