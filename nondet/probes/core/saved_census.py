"""The op census kept between probes of one model, under NONDET_CACHE/op-census.

The census (kernels/census.py) runs six short forwards under a dispatch mode: 1.1-1.6 s of a warm GPU probe
whose whole wall is 16-20 s (docs/benchmarks.md, 2026-12-02). Its answer follows from what the key below
names, so a later probe of the same model finds it on disk and runs none of them; the census it reports then
says it was stored (fingerprint.json census.taken). The key holds:

- the census's own key (model class, config, dtype, device, compiled, instruction set, ranks), the attention
  and experts implementations the model was loaded with (the default forward's logits follow them), and the
  module tree as printed (a module swapped after the load, as the demo's injected norm, is another key);
- each module class's forward, as compiled code, and the file its class came from (size and time): an edited
  or patched forward is another key;
- every file of the model's folder that holds weights, config or code (name, size, modification time);
- the GPU's name, torch's float32 matmul settings, torch's and transformers' versions and the text of
  nondet's kernels (census_store.store_key).

A model that is not a local folder (a hub id, a model built in memory) has no store: its census runs. A
record that cannot be read is a census run again; one that cannot be written is only a later census run.
NONDET_SAVED_CENSUS=0 turns the store off.
"""

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from nondet.probes.core.model_files import WEIGHT_SUFFIXES

ENV = "NONDET_SAVED_CENSUS"
FORMAT = 1
FOLDER = "op-census"
MODEL_FILES = (*WEIGHT_SUFFIXES, ".json", ".py")


class SavedCensus:
    """census.take's store for one key: a JSON file holding the census's record and when it was taken."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def read(self):
        """The stored Census, or None where there is none or it is not one this version wrote."""
        from nondet.kernels.census import from_record

        try:
            stored = json.loads(self.path.read_text())
            if stored.get("format") != FORMAT:
                return None
            return from_record(stored["record"], f"stored by an earlier run ({stored['taken_at']})")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def write(self, census) -> None:
        stored = {"format": FORMAT, "taken_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                  "record": census.to_record()}
        part = self.path.with_name(f"{self.path.name}.{os.getpid()}.part")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            part.write_text(json.dumps(stored))
            os.replace(part, self.path)  # whole or absent: a concurrent reader never sees half a record
        except OSError:
            part.unlink(missing_ok=True)


def saved_census(model, compiled: bool) -> SavedCensus | None:
    """The store of `model`'s census, or None (no local folder, or NONDET_SAVED_CENSUS=0)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    folder = _folder(model)
    if folder is None:
        return None
    from nondet.probes.core.cache_dir import cache_root

    return SavedCensus(cache_root() / FOLDER / f"{_digest(model, compiled, folder)}.json")


def _folder(model) -> Path | None:
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    folder = Path(name).expanduser() if name else None
    return folder if folder is not None and folder.is_dir() else None


def _digest(model, compiled: bool, folder: Path) -> str:
    import torch

    from nondet.kernels.census import cache_key
    from nondet.kernels.census_store import store_key

    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    implementations = [str(getattr(model.config, name, None)) for name in ("_attn_implementation",
                                                                          "_experts_implementation")]
    what = [repr(cache_key(model, compiled)), repr(model), *implementations, *_forwards(model), *_files(folder),
            torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
            torch.get_float32_matmul_precision(), str(torch.backends.cuda.matmul.allow_tf32),
            str(torch.backends.cudnn.allow_tf32)]
    extra = hashlib.sha256("\n".join(what).encode()).hexdigest()
    return store_key(model.config.to_json_string(), str(model.dtype), device.type, f"op-census:{FORMAT}:{extra}")


def _forwards(model) -> list[str]:
    """Per module class: its forward's code (bytes, constants, where it was defined) and its source file's
    size and time."""
    out = []
    for cls in sorted({type(m) for m in model.modules()}, key=lambda c: f"{c.__module__}.{c.__qualname__}"):
        code = getattr(getattr(cls, "forward", None), "__code__", None)
        body = (hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest(),
                code.co_filename, code.co_firstlineno) if code is not None else None
        source = getattr(sys.modules.get(cls.__module__), "__file__", None)
        out.append(f"{cls.__module__}.{cls.__qualname__} {body} {_stat(source)}")
    return out


def _files(folder: Path) -> list[str]:
    return [f"{p.name} {_stat(p)}" for p in sorted(folder.iterdir()) if p.suffix in MODEL_FILES and p.is_file()]


def _stat(path) -> str:
    if not path:
        return "-"
    try:
        st = os.stat(path)
    except OSError:
        return "-"
    return f"{st.st_size}:{st.st_mtime_ns}"
