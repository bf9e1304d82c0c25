"""The V6 chapter's accuracy cell: relative error against float64 of a version and of SDPA on the same inputs.

    python -m flashattn.measure.accuracy v6 --out results/h200      # needs a GPU; writes v6_accuracy.json

flashattn.book.accuracy_cell.accuracy_table shows it (live on a GPU, else the record).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from flashattn.measure import results
from flashattn.reference import attention_reference, relative_error, sdpa
from flashattn.validate import plan

# (dtype, logit scale, causal, (B, H, M, N, D)): the chapter's accuracy cell. Scale 25 multiplies q, so the
# scores reach several hundred and exp overflows without the running max. float32 runs V6's TF32 mode.
ACCURACY_CASES = [(dtype, scale, causal, shape)
                  for dtype in ("bfloat16", "float16", "float32") for scale in (1.0, 25.0)
                  for causal, shape in ((False, (2, 3, 203, 113, 64)), (True, (1, 2, 1023, 1025, 128)))]


def accuracy_rows(version: str, cases=ACCURACY_CASES) -> list[dict]:
    """Relative error against float64 (flashattn.reference) of `version` and of SDPA on the same inputs,
    per case; needs a GPU."""
    rows = []
    for i, (dtype, scale, causal, (B, H, M, N, D)) in enumerate(cases):
        g = torch.Generator(device="cuda").manual_seed(1000 + i)
        q, k, v = (torch.randn(B, H, L, D, device="cuda", generator=g) for L in (M, N, N))
        q, k, v = (q * scale).to(getattr(torch, dtype)), k.to(getattr(torch, dtype)), v.to(getattr(torch, dtype))
        ref = attention_reference(q, k, v, causal=causal)
        call = plan(q, k, v, version, causal)
        ours, theirs = relative_error(call.run(q, k, v), ref), relative_error(sdpa(q, k, v, causal), ref)
        rows.append(dict(dtype=dtype, logit_scale=scale, causal=causal, shape=[B, H, M, N, D],
                         runs_as=call.runs_as, rel_error=ours, sdpa_rel_error=theirs))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashattn.measure.accuracy",
                                description="Record the V6 chapter's accuracy cell on a GPU (VERSION_accuracy.json "
                                            "in OUT).")
    p.add_argument("version", nargs="?", default="v6")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("python -m flashattn.measure.accuracy needs a CUDA GPU")
    rows = accuracy_rows(args.version)
    path = args.out / f"{args.version}_accuracy.json"
    results.write(path, "accuracy", rows, meta={**results.environment(argv), "version": args.version})
    for r in rows:
        print(f"{r['dtype']:9} x{r['logit_scale']:<4g} causal={r['causal']!s:5} {r['shape']} ours {r['rel_error']:.2e} "
              f"sdpa {r['sdpa_rel_error']:.2e}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
