"""Where a GPU probe's first seconds go, before anything decodes: imports, the CUDA context, the model's load.

    python3 scripts/device/gpu_startup.py MODEL_DIR [--overlap]

Prints one line per phase (seconds since the process began): torch imported, transformers imported, the
tokenizer and config read, the model built from its checkpoint on the CPU, its weights on the GPU, the first
matmul (cuBLAS's handle) done. With --overlap the CUDA context is made in a thread started right after torch's
import, beside the transformers import and the CPU load, to measure whether the two overlap (they do only where
the context's creation releases the GIL). Run each form in its own process: the context is made once per process.
"""

import sys
import threading
import time

BEGAN = time.perf_counter()


def mark(name: str) -> None:
    print(f"{name}: {time.perf_counter() - BEGAN:.2f} s", flush=True)


def make_context() -> None:
    import torch

    torch.empty(1, device="cuda")
    torch.cuda.synchronize()


def main() -> None:
    model_dir, overlap = sys.argv[1], "--overlap" in sys.argv
    import torch

    mark("import torch")
    helper = threading.Thread(target=make_context) if overlap else None
    if helper:
        helper.start()
    import transformers  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    mark("import transformers")
    AutoTokenizer.from_pretrained(model_dir)
    AutoConfig.from_pretrained(model_dir)
    mark("tokenizer and config")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    mark("model on the CPU")
    if helper:
        helper.join()
        mark("context thread joined")
    else:
        make_context()
        mark("CUDA context")
    model = model.to("cuda")
    torch.cuda.synchronize()
    mark("weights on the GPU")
    x = torch.ones(8, 64, device="cuda", dtype=torch.bfloat16)
    (x @ x.T).sum().item()
    mark("first matmul")


if __name__ == "__main__":
    main()
