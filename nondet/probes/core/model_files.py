"""The files of a model folder, by what they hold: the weights (their bytes say how much memory a load takes,
and their size and time whether a folder changed)."""

from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def loaded_bytes(folder: Path, dtype: str) -> int | None:
    """The bytes the folder's weights take once loaded in `dtype`, or None where the files cannot say.

    The first kind present counts (a repository shipping safetensors and .bin loads one); a GGUF is dequantized
    on load, so its size says nothing of the memory (None). A float32 load of a 16-bit checkpoint doubles it;
    the other way it halves, counted whole: an upper bound."""
    for suffix in (s for s in WEIGHT_SUFFIXES if s != ".gguf"):
        stored = sum(f.stat().st_size for f in folder.glob(f"*{suffix}") if f.is_file())
        if stored:
            return stored * 2 if dtype == "float32" else stored
    return None
