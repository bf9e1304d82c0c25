"""Convert every JSON record under results/ to the one format of flashattn.measure.results, keeping every number.

    python scripts/migrate_results.py            # convert the files still in an old shape, in place
    python scripts/migrate_results.py --check    # only say which files are in an old shape (exit 1 if any)

The records were written in several shapes over the project's history: the benchmark's
`{"schema": 1, "runs": [{meta, settings, rows}]}` (also the backward steps' and the training demo's), the
sweeps' and kernel times' `{"schema": "flashattn.X/1", meta, settings, variants|runs, ...}`, the trace's
`{schema, flags, environment, runs}`, and files with bare keys (the accuracy cell, the Nsight Compute
notes, the V8 candidates, the V5 exploration, the ceilings, the RTX 4080 reference, the compiler's report).
`convert` maps each to `{schema, meta, settings, rows}` (the rules are flashattn.measure.results' docstring);
benchmark rows recorded before the rename say `impl` and `ran_as`, and get today's `version` and `runs_as`.

Before a file is written, `verify` checks that the new document holds the same multiset of numbers (and of
booleans and nulls) as the old one, and every string of the old one, leaving out only the old `schema` field and
the `run` index the run form adds to each row: no measured number is lost or changed.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashattn.measure import results  # noqa: E402

OLD_KEYS = {"impl": "version", "ran_as": "runs_as"}      # benchmark rows recorded before the rename
RUN_KINDS = {"bench": "bench", "backward": "backward_steps", "train": "training"}


def leaves(x, skip_run: bool = False) -> tuple[Counter, Counter, Counter]:
    """(numbers, strings, other scalars: booleans and nulls) of a JSON value, as multisets; `skip_run`
    leaves out the "run" key of every row of a document's rows (the index the run form adds)."""
    numbers, strings, other = Counter(), Counter(), Counter()

    def walk(v, row=False):
        if isinstance(v, dict):
            for k, w in v.items():
                if not (row and k == "run"):
                    walk(w)
        elif isinstance(v, list):
            for w in v:
                walk(w)
        elif isinstance(v, bool) or v is None:
            other[repr(v)] += 1
        elif isinstance(v, (int, float)):
            numbers[(type(v).__name__, v)] += 1
        else:
            strings[v] += 1

    for key, value in x.items():
        if key == "schema":
            continue
        if key == "rows" and skip_run:
            for row in value:
                walk(row, row=True)
        else:
            walk(value)
    return numbers, strings, other


def verify(old: dict, new: dict) -> None:
    """Raise ValueError unless `new` keeps every number, boolean, null and string of `old`."""
    results.kind_of(new)
    (n0, s0, o0), (n1, s1, o1) = leaves(old), leaves(new, skip_run="runs" in new["meta"])
    if n0 != n1:
        raise ValueError(f"numbers differ: lost {dict(n0 - n1)}, gained {dict(n1 - n0)}")
    if o0 != o1:
        raise ValueError(f"booleans/nulls differ: {dict(o0)} -> {dict(o1)}")
    if s0 - s1:
        raise ValueError(f"strings lost: {dict(s0 - s1)}")


def _rename(d: dict) -> dict:
    return {OLD_KEYS.get(k, k): v for k, v in d.items()}


def _runs(kind: str, doc: dict) -> dict:
    """{"schema": 1, "runs": [...]}: the run form (one run: the plain form)."""
    parts = []
    for run in doc["runs"]:
        run = dict(run)
        if kind == "bench":
            run["rows"] = [_rename(r) for r in run["rows"]]
            if "settings" in run:
                run["settings"] = {("versions" if k == "impl" else k): v for k, v in run["settings"].items()}
        if kind == "training":          # one row per attention; the model's config are its settings
            meta = dict(run["meta"], data=run["data"], timing=run["timing"])
            run = {"meta": meta, "settings": run["config"],
                   "rows": [{"attention": a, **v} for a, v in run["attentions"].items()]}
        extra = set(run) - {"meta", "settings", "rows"}
        if extra:
            raise ValueError(f"a run with keys {sorted(extra)} has no rule")
        parts.append(run)
    return results.several(kind, parts)


def _table(kind: str, doc: dict, table: str, meta_key: str | None = "meta") -> dict:
    """A document with one table (`table`) and other keys: the table is the rows, the rest goes to meta."""
    meta = dict(doc.get(meta_key) or {}) if meta_key else {}
    rest = {k: v for k, v in doc.items() if k not in ("schema", table, meta_key, "settings")}
    clash = set(rest) & set(meta)
    if clash:
        raise ValueError(f"keys {sorted(clash)} are in both meta and the document")
    return results.document(kind, doc[table], {**meta, **rest}, doc.get("settings"))


def convert(path: Path, doc: dict) -> dict:
    """The one-format document of an old record (by the shape of the file and its name)."""
    name, s = path.name, doc.get("schema")
    if s == 1:
        return _runs(next(k for p, k in RUN_KINDS.items() if name.startswith(p)), doc)
    if s in ("flashattn.sweep/1",):
        return _table("sweep", doc, "variants")
    if s == "flashattn.kernel_times/1":
        return _table("kernel_times", doc, "runs")
    if s == "flashattn.trace/1":
        return _table("trace", doc, "runs", meta_key="environment")
    if s == "h1 v5 experiments/1":
        return _table("explore", doc, "timings")
    if name.endswith("_ncu.json"):
        return results.document("ncu", [{"kernel": k} for k in doc["kernels"]],
                                {k: v for k, v in doc.items() if k != "kernels"})
    if name.endswith("_accuracy.json"):
        return _table("accuracy", doc, "rows", meta_key=None)
    if name.startswith("v8_candidates"):
        return _table("candidates", doc, "runs", meta_key=None)
    if name == "ceilings.json":
        rows = [{"name": k, **v} for k, v in doc["ceilings"].items()]
        return results.document("ceilings", rows, {k: v for k, v in doc.items() if k != "ceilings"})
    if name == "rtx4080.json":
        rows = [{"version": k, "latency_us": v} for k, v in doc["latency_us"].items()]
        return results.document("reference", rows, {k: v for k, v in doc.items() if k != "latency_us"})
    if name == "resources.json":
        rows = []
        for version, per_arch in doc["kernels"].items():
            for arch, kernels in per_arch.items():
                assert all(k["arch"] == arch for k in kernels), f"{version} {arch}: a kernel of another arch"
                rows += [{"version": version, **k} for k in kernels]
        return results.document("resources", rows, {"nvcc": doc["nvcc"]}, {"flags": doc["flags"]})
    raise ValueError(f"{path}: no rule for this shape (keys {sorted(doc)})")


def old_files(root: Path) -> list[Path]:
    """The records under `root` that are not in the one format."""
    out = []
    for path in results.records(root):
        try:
            results.read(path)
        except results.RecordError:
            out.append(path)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="list the files in an old shape; exit 1 if there are any")
    p.add_argument("--root", type=Path, default=results.REPO_ROOT / "results")
    args = p.parse_args(argv)
    todo = old_files(args.root)
    for path in todo:
        text = path.read_text()
        old = json.loads(text)
        new = convert(path, old)
        verify(old, new)
        if args.check:
            print(f"old shape: {path} (converts to {new['schema']}, every number kept)")
            continue
        results.save(path, new, indent=1 if "\n " in text[:200] else None)
        print(f"{path}: {new['schema']}, {len(new['rows'])} rows")
    if not todo:
        print(f"every record under {args.root} is in the one format")
    return 1 if args.check and todo else 0


if __name__ == "__main__":
    sys.exit(main())
