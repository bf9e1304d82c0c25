"""The V6 chapter's accuracy cell: measured now on a GPU (flashattn.measure.accuracy), else read from the record
of `python -m flashattn.measure.accuracy` (results/h200/VERSION_accuracy.json).
"""
from __future__ import annotations

from flashattn.book.notebook import NO_GPU, gpu, md
from flashattn.book.records import RESULTS
from flashattn.measure import results
from flashattn.measure.accuracy import accuracy_rows


def device_name(meta: dict, default: str = "the H200") -> str:
    """The GPU a record names: meta["device"] is the environment's dict, or a name in the older records."""
    device = meta.get("device") or default
    return device.get("name", default) if isinstance(device, dict) else device


def accuracy_table(version: str = "v6", file: str = "v6_accuracy.json"):
    """The accuracy cell: live on a GPU (flashattn.measure.accuracy), else the H200 record
    (`python -m flashattn.measure.accuracy VERSION --out results/h200`)."""
    if gpu():
        rows, note = accuracy_rows(version), "Measured now."
    else:
        print(NO_GPU.format(what="the errors"))
        doc = results.read_if_exists(RESULTS / file, "accuracy")
        if doc is None:
            return md(f"*No recorded accuracy yet (`results/h200/{file}`).*")
        rows, note = doc["rows"], f"Recorded on {device_name(doc['meta'])} (`results/h200/{file}`)."
    lines = ["| input dtype | logit scale | causal | B, H, M, N, D | ran as | relative error | SDPA's | ratio |",
             "|---|--:|---|---|---|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['logit_scale']:g} | {r['causal']} | {', '.join(map(str, r['shape']))} | "
                     f"{r['runs_as']} | {r['rel_error']:.1e} | {r['sdpa_rel_error']:.1e} | "
                     f"{r['rel_error'] / r['sdpa_rel_error']:.2f} |")
    return md("\n".join(lines) + "\n\nRelative error ||O - O_ref|| / ||O_ref|| against float64 attention on the "
              "same inputs; SDPA is PyTorch's own attention in the same dtype (for float32 its float32 path, "
              "so the last rows compare TF32 with float32 accuracy). " + note)
