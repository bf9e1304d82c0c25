"""The one format of every record under results/, its writer and its reader.

A record is one JSON object with four keys:

    {"schema": "flashattn.<kind>/2", "meta": {...}, "settings": {...}, "rows": [...]}

- `schema` names the kind of record (bench, sweep, trace, ...: KINDS) and the format's number (FORMAT; the
  shapes before this one, `{"schema": 1, "runs": [...]}`, "flashattn.sweep/1" and the files without a schema,
  were format 1, and `scripts/migrate_results.py` converted them keeping every number).
- `rows` is the record's one table: a benchmark's rows, a sweep's variants, a trace's shapes, a compiler
  report's kernels. Each row is a flat-ish dict; what belongs to one row (its timing, its kernels, a trace's
  items) stays inside it.
- `meta` says what the record is and where it came from: by default the environment of the run
  (`environment`: device, driver, torch, CUDA, git commit, command line). Anything else the record keeps
  beside its table lives in `meta` under its own name: a sweep's `references` (the SDPA rows timed with the
  variants), its `version`, `dtype` and step order `steps`, a trace's build `flags`.
- `settings` holds how it was measured (warm-ups, repetitions, rounds, dtype, ...).

Several runs in one file (a benchmark run with `--append`, the repeated runs of one comparison): every row
carries `"run": i` (0, 1, ...), and `meta["runs"][i]`, `settings["runs"][i]` hold run i's own meta and
settings; `runs(doc)` splits such a file back into one document per run (and returns a one-run file as it
is). `append` adds a run to a file.

The records that are not runs of a tool here take the same format too, so that one reader reads every file
and one test (tests/test_results.py) checks them all: the RTX 4080 figures transcribed from the project's
description (results/reference/rtx4080.json), the ceilings measured once with PyTorch's GEMMs
(results/h200/ceilings.json) and the compiler's report (results/compile/resources.json). Their tables are
rows, their descriptions meta.

What a row is, per kind:

    bench           one version at one shape (flashattn.measure.bench; bench*.json)
    backward_steps  one backward build at one shape (flashattn.book.backward_steps; backward_*.json)
    sweep           one variant of a sweep or step chain; meta: version, dtype, references, steps (v*_sweep.json,
                    v*_steps.json)
    kernel_times    one version at one length, its kernels inside (flashattn.book.kernel_times)
    trace           one traced shape, its stamps inside; meta: flags (flashattn.book.trace; v8_trace*.json)
    training        one attention's curves and step time; settings: the model (flashattn.book.training)
    accuracy        one input case (flashattn.measure.accuracy; v6_accuracy.json)
    ncu             one profiled kernel, in launch order; meta: shape, raw_csv, command (backward_*_ncu.json)
    candidates      one timed repetition; meta: candidates, checks (v8_candidates*.json)
    explore         one shape's timings; meta: about, candidates (v5_explore.json)
    ceilings        one measured ceiling; meta: pytorch_attention, the device (ceilings.json)
    reference       one version's latency on the RTX 4080; meta: the rest of the transcription (rtx4080.json)
    resources       one kernel for one architecture (flashattn.measure.resources; resources.json)
    decode          one timed call of the Decoding chapter; `part` says which table (flashattn.measure.decode_bench)
    generation      one attention's generation run (flashattn.book.generation; generation.json)
    host_cost       one path's host and GPU time for one attention call (flashattn.measure.host_cost)
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from flashattn.loader import REPO_ROOT

FORMAT = 2
KINDS = ("bench", "backward_steps", "sweep", "kernel_times", "trace", "training", "accuracy", "ncu", "candidates",
         "explore", "ceilings", "reference", "resources", "decode", "decode_timeline", "generation", "ring",
         "prefill", "host_cost")
KEYS = ("schema", "meta", "settings", "rows")
H200 = REPO_ROOT / "results" / "h200"          # what was recorded on the H200


class RecordError(ValueError):
    """A file that is not a record of the expected kind in the one format."""


def schema(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown kind of record {kind!r}; one of {', '.join(KINDS)}")
    return f"flashattn.{kind}/{FORMAT}"


def kind_of(doc: dict) -> str:
    """The kind a document in the one format names in its schema; RecordError for anything else."""
    if not isinstance(doc, dict) or set(doc) != set(KEYS):
        keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise RecordError(f"not a record in the one format {{schema, meta, settings, rows}} (keys: {keys}); "
                          "an old shape? scripts/migrate_results.py converts those")
    s = doc["schema"]
    kind = s[len("flashattn."):].rsplit("/", 1)[0] if isinstance(s, str) and s.startswith("flashattn.") else None
    if kind not in KINDS or s != schema(kind):
        raise RecordError(f"schema {s!r} is not flashattn.<kind>/{FORMAT} with a kind of {', '.join(KINDS)}")
    if not isinstance(doc["rows"], list) or not isinstance(doc["meta"], dict) or not isinstance(doc["settings"], dict):
        raise RecordError("a record's rows must be a list and its meta and settings dicts")
    return kind


def document(kind: str, rows, meta: dict | None = None, settings: dict | None = None) -> dict:
    """The record as a dict (what `write` writes); meta defaults to the environment of this run."""
    return {"schema": schema(kind), "meta": environment() if meta is None else dict(meta),
            "settings": dict(settings or {}), "rows": list(rows)}


def write(path, kind: str, rows, meta: dict | None = None, settings: dict | None = None,
          indent: int | None = 1) -> dict:
    """Write one record to `path` (atomically: a killed run leaves the old file or the new, never half) and
    return it. `indent=None` writes one line (the traces: every stamp of every item)."""
    doc = document(kind, rows, meta, settings)
    save(path, doc, indent)
    return doc


def save(path, doc: dict, indent: int | None = 1) -> None:
    """Write a document made by `document` (or read by `read`) after checking its shape."""
    kind_of(doc)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=indent, default=str) + "\n")
    os.replace(tmp, path)


def read(path, kind: str | None = None) -> dict:
    """The record at `path`; RecordError when it is in an old shape or (with `kind`) of another kind."""
    doc = json.loads(Path(path).read_text())
    try:
        got = kind_of(doc)
    except RecordError as err:
        raise RecordError(f"{path}: {err}") from None
    if kind is not None and got != kind:
        raise RecordError(f"{path} is a {got} record, not {kind}")
    return doc


def read_if_exists(path, kind: str | None = None) -> dict | None:
    """`read`, or None when there is no file (a record the GPU run has not written yet)."""
    return read(path, kind) if Path(path).exists() else None


# --------------------------------------------------------------------------------------------- runs
def runs(doc: dict) -> list[dict]:
    """One {"meta", "settings", "rows"} per run of the file, in order (rows without their "run" tag)."""
    if "runs" not in doc["meta"]:
        return [{"meta": doc["meta"], "settings": doc["settings"], "rows": doc["rows"]}]
    out = [{"meta": m, "settings": s, "rows": []} for m, s in zip(doc["meta"]["runs"], doc["settings"]["runs"])]
    for row in doc["rows"]:
        out[row["run"]]["rows"].append({k: v for k, v in row.items() if k != "run"})
    return out


def several(kind: str, parts: list[dict]) -> dict:
    """One document of the runs `parts` ({"meta", "settings", "rows"} each): the run form when there are
    several, the plain one for a single run."""
    if len(parts) == 1:
        return document(kind, parts[0]["rows"], parts[0]["meta"], parts[0].get("settings"))
    rows = [{"run": i, **r} for i, p in enumerate(parts) for r in p["rows"]]
    return document(kind, rows, {"runs": [p["meta"] for p in parts]},
                    {"runs": [p.get("settings") or {} for p in parts]})


def append(path, kind: str, rows, meta: dict | None = None, settings: dict | None = None) -> dict:
    """Add a run to the record at `path` (or start it) and return the file's document."""
    path = Path(path)
    before = runs(read(path, kind)) if path.exists() else []
    part = {"meta": environment() if meta is None else meta, "settings": settings or {}, "rows": list(rows)}
    doc = several(kind, before + [part])
    save(path, doc)
    return doc


# -------------------------------------------------------------------------------------- environment
def _run(cmd, cwd=None) -> str | None:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit() -> dict:
    """The commit of the tree that made the record, and whether it had uncommitted changes."""
    if os.environ.get("FLASHATTN_GIT_COMMIT"):
        # a copy of the tree on a remote GPU machine, with no .git or a stale one: the caller names the
        # commit it sent, and that wins over whatever git would say there
        return {"commit": os.environ["FLASHATTN_GIT_COMMIT"], "dirty": None,
                "commit_source": "FLASHATTN_GIT_COMMIT (tree copied to the GPU machine)"}
    commit = _run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT)
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT)
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def program() -> str:
    """How this process was started, as a user types it: `python -m flashattn.measure.bench` for a module of
    the package, `python scripts/x.py` for a script."""
    path = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if path is None or not path.is_file():
        return "python"
    try:
        rel = path.relative_to(REPO_ROOT)
    except ValueError:
        return f"python {sys.argv[0]}"
    if rel.parts[0] == "flashattn":
        return "python -m " + ".".join(rel.with_suffix("").parts)
    return f"python {rel.as_posix()}"


def environment(argv=None, prog: str | None = None) -> dict:
    """Device, driver, torch, CUDA, cuDNN and git versions (strings; None where unknown), and the command
    line that made the record (`prog`, default `program()`, and argv, sys.argv by default)."""
    env = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "python": platform.python_version(),
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "git": git_commit(),
           "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([prog or program()] + list(sys.argv[1:] if argv is None else argv))}
    if torch.cuda.is_available():
        prop = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["device"] = {"name": prop.name, "capability": f"{prop.major}.{prop.minor}",
                         "sm_count": prop.multi_processor_count, "memory_bytes": prop.total_memory,
                         "l2_bytes": getattr(prop, "L2_cache_size", None)}
        smi = shutil.which("nvidia-smi")
        env["driver"] = _run([smi, "--query-gpu=driver_version", "--format=csv,noheader"]) if smi else None
        if env["driver"]:
            env["driver"] = env["driver"].splitlines()[0]
    return env


def records(root=REPO_ROOT / "results") -> list[Path]:
    """Every JSON record under results/ (what the test and the migration go over)."""
    return sorted(Path(root).rglob("*.json"))
