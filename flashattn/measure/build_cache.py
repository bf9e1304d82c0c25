"""What a compile says (ptxas's report, a hot loop's SASS counts), remembered next to the builds.

A sweep asks the same question of the same kernel text and flags many times: variants that differ only in the
head dim they time share one build, and `--build-only` on a machine's CPUs answers before the timed run. The
answers live in one JSON file per kind in TORCH_EXTENSIONS_DIR (the system's temporary folder without it),
keyed by a hash of everything the compile depends on; threads asking for the same key wait for one compile.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

_LOCK = threading.Lock()
_IN_FLIGHT: dict[str, threading.Lock] = {}


def key_of(*parts) -> str:
    """The cache key of a compile: a hash of its parts (kernel text, flags, architecture)."""
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def cache_path(file: str) -> Path:
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or tempfile.gettempdir()) / file


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def remembered(file: str, key: str, compute: Callable[[], object], keep: Callable[[object], bool] = bool):
    """The answer stored under `key` in the cache file `file`, or compute() (once per key, however many threads
    ask), stored when keep(answer) says it is worth remembering (a failed compile is reported, never kept)."""
    path = cache_path(file)
    with _LOCK:
        cache = _load(path)
        if key in cache:
            return cache[key]
        lock = _IN_FLIGHT.setdefault(key, threading.Lock())
    with lock:                                        # one compile per key, the others wait for it
        with _LOCK:
            cache = _load(path)
        if key in cache:
            return cache[key]
        answer = compute()
        if keep(answer):
            with _LOCK:
                cache = _load(path)
                cache[key] = answer
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(cache))
    return answer
