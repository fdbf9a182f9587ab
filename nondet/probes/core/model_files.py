"""The files of a model folder, by what they hold: the weights (their bytes say how much memory a load takes,
and their size and time whether a folder changed)."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
