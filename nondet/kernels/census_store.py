"""The graph census kept beside Inductor's cache, so a graph the cache serves still has its census.

A graph Inductor serves from its cache is never traced again: the post-grad pass that sorts it
(graph_census.py) does not run. Without a store the census therefore turns the caches off while it
collects, and the mode compiles everything again in every process. With a store, each graph the pass
sorts is written here (one JSON line per distinct graph, before Inductor writes its cache entry), and
the pass's uuid, which is part of Inductor's cache key, names the store. A graph served from the
cache under that uuid was compiled under the census with this store, so its findings are here.

On entry the store's findings are added to the run's census, all of them: more graphs than this run
compiles (other batch sizes, another run's), never fewer, so a reduction found in any graph compiled
for this key refuses the run (remove the file to forget them). The key names the model's config and
dtype, the device type, torch, transformers, and the text of nondet's kernels: a change to any of them
is a new store and a new uuid, so no cached graph is served across it. The file's first line holds a
random generation, also in the uuid: a removed store file starts a new one, so graphs cached while
the old file existed are compiled (and sorted) again rather than served without their findings.
"""

import hashlib
import json
import os
import uuid
from pathlib import Path

FORMAT = 1  # bump when an entry's fields change


class CensusStore:
    """One key's per-graph findings in a JSON-lines file: a first line naming the store's generation,
    then {"graph": digest, **GraphCensus.to_json()} per graph."""

    def __init__(self, path: Path, key: str):
        self.path, self.key = Path(path), key
        self._seen: set[str] | None = None
        self._generation: str | None = None

    def identity(self) -> str:
        """The key and the file's generation, for the pass's uuid. A store file that is missing (never
        made, or removed to forget its findings) is made with a new generation, so no graph Inductor
        cached under an earlier one, whose findings the file no longer holds, is served."""
        if self._generation is None:
            if not self.path.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a") as f:
                    f.write(json.dumps({"format": FORMAT, "generation": uuid.uuid4().hex}) + "\n")
            first = self.path.read_text().split("\n", 1)[0]
            try:
                self._generation = json.loads(first)["generation"]
            except (json.JSONDecodeError, KeyError):  # a file of another kind: a generation no cache knows
                self._generation = uuid.uuid4().hex
        return f"{self.key}:{self._generation}"

    def entries(self) -> list[dict]:
        """The stored graphs' findings, one per graph (tensor-parallel ranks may each have written one)."""
        if not self.path.exists():
            return []
        out: dict[str, dict] = {}
        for line in self.path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a crash: that graph compiles (and is sorted) again
                continue
            if entry.get("format") == FORMAT and "graph" in entry:
                out.setdefault(entry["graph"], entry)
        return list(out.values())

    def append(self, digest: str, found: dict) -> None:
        """One graph's findings, once per distinct graph (written and flushed before the pass returns)."""
        if self._seen is None:
            self._seen = {e["graph"] for e in self.entries()}
        if digest in self._seen:
            return
        self._seen.add(digest)
        self.identity()  # the file starts with its generation
        with open(self.path, "a") as f:  # one write per line: concurrent appenders do not interleave a line
            f.write(json.dumps({"format": FORMAT, "graph": digest, **found}) + "\n")
            f.flush()
            os.fsync(f.fileno())


def store_key(config_json: str, dtype: str, device_type: str, extra: str = "") -> str:
    """What the graphs compiled for a model depend on, as a short digest (see the module doc); extra:
    anything else the caller's graphs depend on (a tensor-parallel degree)."""
    import torch
    import transformers

    kernels = Path(__file__).parent
    code = hashlib.sha256()
    for source in sorted(kernels.glob("*.py")):
        code.update(source.name.encode() + source.read_bytes())
    parts = [config_json, dtype, device_type, extra, torch.__version__, transformers.__version__, code.hexdigest(),
             str(FORMAT)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def graph_digest(graph) -> str:
    """A post-grad graph's text (ops, arguments, shapes as traced), hashed: equal graphs, one entry."""
    return hashlib.sha256(str(graph).encode()).hexdigest()[:20]
