"""The live cells of "The backward on Hopper" (book/backward_hopper.ipynb). On a Hopper GPU (compute capability 9.0)
they run kernels/v8_backward.cu now; anywhere else each prints one line saying that it needs one and shows no
number (the book's page keeps the output of their run on an H200).

- `correctness`: dq, dk, dv against float64 at odd shapes, grouped heads, causal and a window, beside the error of
  PyTorch's SDPA backward on the same bf16 inputs, and the deterministic mode run twice (bit for bit the same?);
- `timing`: the backward alone at V6's four target configurations, in one interleaved run per configuration, every
  column through torch.autograd.grad on the output of its own forward (flashattn.measure.backward.backward_call):
  V8 trained on this kernel, by default and deterministic, V6 (its backward), cuDNN and FlashAttention-4; every
  column with the same host slack and L2 flush;
- `dq_step`: the step from the first version's dQ (V8B_DQ_BULK=0: red.global from every consumer thread) to the
  bulk reduction, and the deterministic mode on it: the kernel file called directly on the same o and lse, every
  column alike, one interleaved run per configuration;
- `step_times("order")`, `step_times("descriptors")`: the same for the order of the blocks (V8B_HEAD_GROUP: all
  heads first, key tiles first, four heads at a time, and the default, as many heads as fit half the L2) and for
  how the wgmma descriptors are made (V8B_DESC_ADD, V8B_UNIFORM_WG: `uniform`); `python -m
  flashattn.book.backward_hopper_live order` (or `descriptors`, `uniform`, `dq`) prints the same table without
  Jupyter.
"""
from __future__ import annotations

import contextlib
import functools
import sys

import torch

from flashattn import reference
from flashattn.autograd import forward_module
from flashattn.book.notebook import gpu, md
from flashattn.loader import build
from flashattn.measure.backward import backward_call, backward_flops
from flashattn.measure.timing import guarded, time_interleaved
from flashattn.measure.variants import SETS

NEEDS = ("Needs a Hopper GPU (compute capability 9.0), which this machine does not have: kernels/v8_backward.cu "
         "is built for sm_90a, and this page shows no {what} until a Hopper GPU runs this cell.")
# (name, B, H, H_kv, M, N, D, causal, window): tiles cut at both ends, M != N, both head dims, grouped heads
CASES = (
    ("odd sizes, M < N", 2, 3, 3, 113, 203, 128, False, (-1, -1)),
    ("causal, one key tile short of a whole one", 2, 4, 4, 1025, 1025, 64, True, (-1, -1)),
    ("grouped heads 8 / 2, causal, M ≠ N", 1, 8, 2, 1023, 1025, 128, True, (-1, -1)),
    ("sliding window (100, 50), grouped heads", 2, 4, 2, 300, 517, 64, False, (100, 50)),
)
# V6's backward targets (flashattn.book.backward_steps.TARGETS): B, H, M = N, D, causal
TARGETS = ((4, 12, 2048, 64, False), (2, 16, 8192, 128, False), (4, 12, 2048, 64, True), (2, 16, 8192, 128, True))
# column -> flashattn.measure.backward's name
COLUMNS = {"v8_backward": "v8_backward", "v8_backward, deterministic": "v8_backward_deterministic", "v6": "v6",
           "cuDNN": "sdpa_cudnn", "FA4": "fa4"}


def hopper() -> bool:
    return gpu() and torch.cuda.get_device_capability() == (9, 0)


@functools.cache
def module(build_name: str = "default"):
    """kernels/v8_backward.cu built as the loader builds it (sm_90a, its `backward` binding), or as the build
    `build_name` of flashattn.measure.variants' "v8-backward" set, under a module name of its own (the one
    tests/test_v8_backward.py gives the dq_atomics build, so either builds it once)."""
    if build_name == "default":
        return build("v8_backward", archs=["9.0a"], functions=("backward",))
    return build("v8_backward", extra_cuda_cflags=SETS["v8-backward"][build_name].flags, archs=["9.0a"],
                 functions=("backward",), module_name=f"flashattn_v8_backward_{build_name}")


def inputs(B, H, H_kv, M, N, D, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(B, H, M, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(B, H_kv, N, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    return q, k, v, do


def correctness(cases=CASES):
    """Relative errors of dq / dk / dv against float64 (flashattn.reference.attention_gradients), ours and SDPA's,
    and whether two runs of the deterministic mode agree bit for bit (and its dq's error)."""
    if not hopper():
        print(NEEDS.format(what="gradient errors"))
        return None
    lines = ["| case | B, H / H_kv, M, N, D | ours: dq / dk / dv | SDPA: dq / dk / dv | deterministic: twice the "
             "same bits; its dq |", "|---|---|--:|--:|--:|"]
    for n, (name, B, H, H_kv, M, N, D, causal, window) in enumerate(cases):
        q, k, v, do = inputs(B, H, H_kv, M, N, D, seed=n)
        o, lse = forward_module("v8").forward_lse(q, k, v, causal, None, *window)
        ours = module().backward(q, k, v, o, lse, do, causal, False, None, *window)
        det = [module().backward(q, k, v, o, lse, do, causal, True, None, *window) for _ in range(2)]
        ref = reference.attention_gradients(q, k, v, do, causal, window=window)
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        theirs = torch.autograd.grad(reference.sdpa(*leaves, causal, window=window), leaves, do)
        cells = [" / ".join(f"{reference.relative_error(g, r):.1e}" for g, r in zip(got, ref))
                 for got in (ours, theirs)]
        same = "yes" if all(torch.equal(a, b) for a, b in zip(*det)) else "**no**"
        lines.append(f"| {name} | {B}, {H} / {H_kv}, {M}, {N}, {D} | {cells[0]} | {cells[1]} | {same}; "
                     f"{reference.relative_error(det[0][0], ref[0]):.1e} |")
    return md("\n".join(lines) + f"\n\nMeasured now on {torch.cuda.get_device_name()}, bf16 inputs, o and lse from "
              "V8's forward_lse; relative error: the norm of the difference over the norm of the float64 gradient.")


def timing(targets=TARGETS, warmup: int = 10, repetitions: int = 50, rounds: int = 10, max_seconds: float = 1.5,
           host_slack_us: float = 1000.0):
    """Backward times (median µs) and TFLOP/s (flashattn.measure.backward.backward_flops), one interleaved run per
    configuration, every column a torch.autograd.grad call; a column that cannot run here holds its reason."""
    if not hopper():
        print(NEEDS.format(what="backward times"))
        return None
    lines = ["| B, H, M = N, D | causal | " + " | ".join(f"{c}: µs (TFLOP/s)" for c in COLUMNS) +
             " | v6 / v8_backward |", "|---|---|" + "--:|" * (len(COLUMNS) + 1)]
    for B, H, L, D, causal in targets:
        q, k, v, do = inputs(B, H, H, L, L, D)
        calls = {c: guarded(backward_call, name, q, k, v, do, causal) for c, name in COLUMNS.items()}
        timed = time_interleaved({n: (fn, contextlib.nullcontext) for n, fn in calls.items()}, warmup=warmup,
                                 repetitions=repetitions, rounds=rounds, max_seconds=max_seconds,
                                 host_slack_us=host_slack_us)
        us = {n: t.summary()["median_us"] for n, t in timed.items() if not isinstance(t, Exception)}
        flops = backward_flops(B, H, L, L, D, causal)
        cells = [f"{us[c]:,.1f} ({flops / us[c] / 1e6:,.0f})" if c in us else f"not run: {timed[c]}" for c in COLUMNS]
        ratio = f"{us['v6'] / us['v8_backward']:.2f}×" if {"v6", "v8_backward"} <= set(us) else "—"
        lines.append(f"| {B}, {H}, {L}, {D} | {'yes' if causal else 'no'} | " + " | ".join(cells) + f" | {ratio} |")
    return md("\n".join(lines) + f"\n\nMeasured now on {torch.cuda.get_device_name()}, bf16, every column "
              "torch.autograd.grad on its own forward's output: CUDA events, L2 flushed before every call, "
              f"{host_slack_us:.0f} µs of host slack for every column, interleaved rounds, the median. "
              "v6 / v8_backward: above 1, this kernel is faster.")


def time_builds(steps: dict, targets=TARGETS, warmup: int = 10, repetitions: int = 50, rounds: int = 10,
                max_seconds: float = 1.5, host_slack_us: float = 1000.0) -> list[tuple[tuple, list[float]]]:
    """[(target, median µs of each of `steps`)]: steps maps a column to (build name, deterministic); each build's
    `backward` (pre-pass, dK/dV kernel, dQ conversion) is called directly on the same o and lse from V8's
    forward, one interleaved run per target."""
    rows = []
    for B, H, L, D, causal in targets:
        q, k, v, do = inputs(B, H, H, L, L, D)
        o, lse = forward_module("v8").forward_lse(q, k, v, causal, None, -1, -1)
        calls = {c: functools.partial(module(b).backward, q, k, v, o, lse, do, causal, det, None, -1, -1)
                 for c, (b, det) in steps.items()}
        timed = time_interleaved({n: (fn, contextlib.nullcontext) for n, fn in calls.items()}, warmup=warmup,
                                 repetitions=repetitions, rounds=rounds, max_seconds=max_seconds,
                                 host_slack_us=host_slack_us)
        rows.append(((B, H, L, D, causal), [timed[c].summary()["median_us"] for c in steps]))
    return rows


def _table(steps: dict, rows, ratios: dict[str, tuple[int, int]], note: str) -> str:
    lines = ["| B, H, M = N, D | causal | " + " | ".join(f"{c}: µs" for c in steps) + " | " + " | ".join(ratios) +
             " |", "|---|---|" + "--:|" * (len(steps) + len(ratios))]
    for (B, H, L, D, causal), us in rows:
        lines.append(f"| {B}, {H}, {L}, {D} | {'yes' if causal else 'no'} | " + " | ".join(f"{t:,.1f}" for t in us) +
                     " | " + " | ".join(f"{us[a] / us[b]:.2f}×" for a, b in ratios.values()) + " |")
    return ("\n".join(lines) + f"\n\nMeasured now on {torch.cuda.get_device_name()}, bf16: CUDA events, L2 "
            "flushed before every call, 1000 µs of host slack, interleaved rounds, the median. " + note)


# The steps timed build against build: (what a table shows, its columns: (build, deterministic), its ratios:
# (column a, column b) -> a / b, how to read them)
STEPS = {
    "dq": ("dQ-step times", {"red.global (V8B_DQ_BULK=0)": ("dq_atomics", False),
                             "bulk reduction (default)": ("default", False), "bulk, deterministic": ("default", True)},
           {"red.global / bulk": (0, 1), "deterministic / bulk": (2, 1)},
           "Ratios above 1: the bulk reduction is faster."),
    "order": ("block-order times", {"all heads first (the first order)": ("heads_all", False),
                                    "key tiles first": ("keys_first", False), "4 heads at a time": ("heads4", False),
                                    "heads that fit half the L2 (default)": ("default", False)},
              {"all heads / default": (0, 3), "keys first / default": (1, 3), "4 heads / default": (2, 3)},
              "Ratios above 1: the default order is faster."),
    "descriptors": ("descriptor-step times", {"make_desc per wgmma (V8B_DESC_ADD=0)": ("desc_make", False),
                                              "descriptor + offset (default)": ("default", False)},
                    {"per wgmma / default": (0, 1)}, "Ratios above 1: adding the offsets is faster."),
    "uniform": ("warpgroup-index step times", {"from threadIdx (default)": ("wg_lanes", False),
                                               "from lane 0 (V8B_UNIFORM_WG=1)": ("wg_uniform", False),
                                               "from threadIdx, deterministic": ("wg_lanes", True),
                                               "from lane 0, deterministic": ("wg_uniform", True)},
                {"threadIdx / lane 0": (0, 1), "deterministic, threadIdx / lane 0": (2, 3)},
                "Ratios above 1: the descriptors in uniform registers are faster."),
    # measured at B_r = 64, every column (1 spills at B_r = 80, the default at D = 128 without a band since)
    "dv": ("dV-step times", {"with dK_j (V8B_EARLY_DV=0)": ("dv_late", False),
                             "before dPᵀ's wait (1; D=64: with dK_j)": ("dv_before_dp", False),
                             "after dSᵀ is stored (default place)": ("br64", False)},
           {"with dK_j / default": (0, 2), "before dPᵀ's wait / default": (1, 2)},
           "Ratios above 1: the default is faster."),
    "stages": ("stage-count times", {"3 slots (V8B_STAGES=3)": ("stages3", False),
                                     "2 slots (default)": ("default", False)},
               {"3 / 2 slots": (0, 1)}, "Ratios above 1: two slots are faster."),
    "rows": ("row-term times", {"lse2_i among the wgmmas (V8B_ROW_PREFETCH=1)": ("rows1", False),
                                "and D_i (2)": ("rows2", False),
                                "lse2_i before them (3)": ("rows3", False),
                                "after the waits (0)": ("rows0", False),
                                "3, and D_i among them (4, default)": ("default", False)},
             {"1 / 0": (0, 3), "2 / 0": (1, 3), "3 / 0": (2, 3), "4 / 3": (4, 2)},
             "Ratios below 1: loading the row terms early is faster (at B_r = 80, non-causal D = 128, 3 and 4 are "
             "0)."),
    # the deterministic mode took 2,713 µs at 0e647c9 and 2,897 at f2d19b2 (causal, 2, 16, 8192, 128): which
    # row-term placement it is slower with, against the default mode on the same build. Since the deterministic
    # mode's banded kernel at D = 128 is its own instance (V8B_DET_ROW_PREFETCH, 0 by default), the builds set
    # its placement; at D = 64 and without a band both modes run one kernel (4), so those rows measure the run's
    # spread in the first two ratios.
    "rows_deterministic": ("row-term times in the deterministic mode",
                           {"0 (its default), deterministic": ("default", True),
                            "3, deterministic": ("det_rows3", True),
                            "4 (the default mode's), deterministic": ("det_rows4", True),
                            "default mode (4)": ("default", False)},
                           {"0 / 4, deterministic": (0, 2), "3 / 4, deterministic": (1, 2),
                            "deterministic / default": (0, 3), "deterministic with 4 / default": (2, 3)},
                           "Ratios below 1 in the first two: that placement of the row terms is faster in the "
                           "deterministic mode; the third is the mode's cost as built now, the fourth as it was "
                           "with one kernel for both modes."),
    "tile": ("query-tile times", {"B_r = 80 (default)": ("default", False), "B_r = 64 (V8B_BR80=0)": ("br64", False),
                                  "B_r = 80, deterministic": ("default", True)},
             {"80 / 64": (0, 1), "deterministic / default, B_r = 80": (2, 0)},
             "Ratios above 1 in the first: B_r = 64 is faster. The switch changes only the unmasked kernel at D = 128 "
             "(causal rows and D = 64 run the same kernel in both columns: their ratio is the run's spread)."),
}


def step_text(name: str, targets=TARGETS) -> str | None:
    """One of STEPS as a Markdown table, measured now (a Hopper GPU; elsewhere None, after one line saying it needs
    one)."""
    what, steps, ratios, note = STEPS[name]
    if not hopper():
        print(NEEDS.format(what=what))
        return None
    return _table(steps, time_builds(steps, targets), ratios, note)


def step_times(name: str, targets=TARGETS):
    """step_text for a notebook cell."""
    text = step_text(name, targets)
    return None if text is None else md(text)


def dq_step(targets=TARGETS):
    """The step from the first version's dQ (red.global) to the bulk reduction, and the deterministic mode on it."""
    return step_times("dq", targets)


def main(argv=None) -> int:
    """`python -m flashattn.book.backward_hopper_live STEP`: print that step's table (STEPS; a Hopper GPU)."""
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1 or args[0] not in STEPS:
        print(f"usage: python -m flashattn.book.backward_hopper_live {{{','.join(STEPS)}}}", file=sys.stderr)
        return 2
    table = step_text(args[0])
    print(table or "")
    return 0 if table is not None else 1


if __name__ == "__main__":
    sys.exit(main())
