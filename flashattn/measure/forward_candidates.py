"""V8's forward against FlashAttention-4, candidate by candidate: `python -m flashattn.measure.forward_candidates
[--set steps|head_group|descriptors|key_tile]`.

At D = 128 FlashAttention-4 runs the same block as v8 (a producer and two consumer warpgroups, 168 registers,
B_r = B_c = 128, two K/V slots) and took 0.93 to 0.97 of v8's time at the anchor shapes before these steps
(results/h200/prefill.json at 0282892; prefill_forward.json has them since); Nsight Compute counted about a
fifth fewer instructions for it
(../shared/anchors/fa4-ncu-2026-12-01.md). Each candidate is one compile-time switch of kernels/v8.cu, built
beside the default, and the builds' outputs must agree bit for bit (none changes an operation on the data, only
its order, its addressing or which block computes it), except the key tile's. Four sets:

* `steps` (every forward row at D = 128 of the FlashAttention-4 table, prefill_bench.FORWARD_SHAPES; run at
  8188023 and 2017849, whose default had V8_DESC_ADD=0 and no V8_UNIFORM_WG):
  `desc_add`: V8_DESC_ADD=1, a product's descriptors made once per operand tile and the k steps added to the
  start-address field (the backward's V8B_DESC_ADD); the unmasked loop at D = 128 drops from 535 to 489
  instructions per key tile and warp in the SASS. `max4`: V8_MAX_CHAINS=4, the row max in four independent
  chains (FlashAttention-4's fmax_reduce). `stages3`: V8_STAGES=3, a third K/V slot (about 2% in
  results/h200/v8_defaults.json, not the default). `desc_stages3`: the first and the third; `all3`: all three;
* `head_group` (the causal rows of that table, every head dim): the causal order, longest first inside groups of
  heads (V8_HEAD_GROUP=-1, the default: the launcher's head_group, the smallest group of kv heads whose keys and
  values fit in half the L2 and whose blocks stay within 0.04 of all heads' balance), against all heads in one
  group (`heads_all`, V8_HEAD_GROUP=0: the first version's order) and groups of 1 and 4 kv heads;
* `descriptors` (every forward row of that table): how the wgmma descriptors are made. Both switches off
  (`desc_make`, the first version: 535 SASS instructions per key tile and warp in the unmasked loop at D = 128),
  descriptors plus offsets alone (`add_only`: 489), with the warpgroup index from lane 0 in every kernel at
  D = 64 and 128 (`both`: 473), the index alone (`uniform_only`: 519), `both` with a third K/V slot or the clock
  fence, and the default, which gives each kernel its faster build (kernels/v8.cu). The two runs behind the
  default (results/h200/logs/forward_candidates_descriptors_{16c90d8,run2_1dc6db5}.md) name `both` "default"
  and its variants "stages3" and "fence": the default of those commits;
* `key_tile` (the unmasked rows at D = 128, and D = 96's): B_c of the unmasked kernel at D = 128 and at D = 96
  (which runs D = 128's block on zero-padded columns), 128, 144, 160 and 176 (FlashAttention-3's tile at D =
  128), beside the default (128 at D = 128, 160 at D = 96). Another B_c sums each row in another order, so these
  builds are not compared bit for bit: each must be within twice the default's error against a float32
  reference (SDPA on float32 copies of the inputs). The two runs behind the default:
  results/h200/logs/forward_candidates_key_tile_{af827b5,run2_af827b5}.md.

Each shape is one interleaved run (flashattn.measure.timing: L2 flushed, the median) with FlashAttention-4 as a
column. Prints a markdown table: times in µs, and FA4's time over each build's (above 1: the build is faster).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import sys

import torch

from flashattn.loader import build
from flashattn.measure import peers
from flashattn.measure.prefill_bench import FORWARD_SHAPES, WIDE_SHAPES, inputs
from flashattn.measure.timing import add_interleaved_arguments, guarded, interleaved_args
from flashattn.validate import aligned

SETS = {
    "steps": {"default": [], "desc_add": ["-DV8_DESC_ADD=1"], "max4": ["-DV8_MAX_CHAINS=4"],
              "stages3": ["-DV8_STAGES=3"], "desc_stages3": ["-DV8_DESC_ADD=1", "-DV8_STAGES=3"],
              "all3": ["-DV8_DESC_ADD=1", "-DV8_MAX_CHAINS=4", "-DV8_STAGES=3"]},
    "head_group": {"default": [], "heads_all": ["-DV8_HEAD_GROUP=0"], "heads1": ["-DV8_HEAD_GROUP=1"],
                   "heads4": ["-DV8_HEAD_GROUP=4"]},
    "descriptors": {"default": [], "desc_make": ["-DV8_DESC_ADD=0", "-DV8_UNIFORM_WG=0"],
                    "add_only": ["-DV8_UNIFORM_WG=0"], "both": ["-DV8_UNIFORM_WG=2"],
                    "uniform_only": ["-DV8_DESC_ADD=0", "-DV8_UNIFORM_WG=2"],
                    "both_stages3": ["-DV8_UNIFORM_WG=2", "-DV8_STAGES=3"],
                    "both_fence": ["-DV8_UNIFORM_WG=2", "-DV8_CLOCK_FENCE=1"]},
    "key_tile": {"default": [],
                 **{f"bc{n}": [f"-DV8_D128_BC={n}", f"-DV8_D96_BC={n}"] for n in (128, 144, 160, 176)}},
}
SHAPES = {"steps": [s for s in FORWARD_SHAPES if s[4] == 128],   # (B, H_q, H_kv, N, D, causal)
          "head_group": [s for s in FORWARD_SHAPES if s[5]], "descriptors": FORWARD_SHAPES,
          "key_tile": [s for s in FORWARD_SHAPES + WIDE_SHAPES if s[4] in (96, 128) and not s[5]]}
EXACT = {"steps", "head_group", "descriptors"}   # sets whose builds only reorder work: outputs bit for bit equal
FLAGS = {name: flags for variants in SETS.values() for name, flags in variants.items()}


@functools.cache
def variant_module(name: str):
    """kernels/v8.cu's forward build with the flags of candidate `name` (default: none, under its own module
    name)."""
    return build("v8", extra_cuda_cflags=FLAGS[name], module_name=f"flashattn_v8_fwd_{name}")


def check_outputs(calls: dict, q, k, v, causal: bool, scale: float, exact: bool, shape) -> None:
    """Every build's output equals the default's bit for bit (`exact`), or is within twice the default's
    relative error against a float32 reference."""
    want = calls["default"][0]()
    if exact:
        for name, (call, _) in calls.items():
            assert torch.equal(call(), want), f"{name} and default differ at {shape}"
        return
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                           scale=scale, enable_gqa=q.shape[1] != k.shape[1])

    def error(o):
        return ((o.float() - ref).norm() / ref.norm()).item()
    bound = 2 * error(want)
    assert bound < 2e-2, f"the default's error {bound / 2:.1e} at {shape}"
    for name, (call, _) in calls.items():
        assert error(call()) <= bound, f"{name}: error {error(call()):.1e} above twice the default's at {shape}"


def row(shape, variants: dict, args) -> tuple[str, dict]:
    B, H_q, H_kv, N, D, causal = shape
    q, k, v = inputs(B, H_q, H_kv, N, D)
    scale = D ** -0.5

    def variant(name):
        module = variant_module(name)
        return lambda: module.forward(aligned(q), aligned(k), aligned(v), causal, scale, -1, -1)
    calls = {name: (variant(name), contextlib.nullcontext) for name in variants}
    check_outputs(calls, q, k, v, causal, scale, exact=args.set in EXACT, shape=shape)
    with peers.quiet():
        fa4 = guarded(lambda: (peers.forward_call("fa4", q, k, v, causal), contextlib.nullcontext))
    if isinstance(fa4, tuple):
        calls["fa4"] = fa4
    t = {name: r.median_ms * 1e3 for name, r in interleaved_args(calls, args).items() if not isinstance(r, Exception)}
    ratios = [f"{t['fa4'] / t[name]:.2f}" if "fa4" in t else "—" for name in variants]
    times = [f"{t[name]:.1f}" for name in variants]
    fa4_cell = f"{t['fa4']:.1f}" if "fa4" in t else "—"
    line = f"| {B}, {H_q}/{H_kv}, {N}, {D} | {'yes' if causal else 'no'} | {' | '.join(times)} | {fa4_cell} | " \
           f"{' | '.join(ratios)} |"
    return line, t


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashattn.measure.forward_candidates", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=list(SETS), default="steps", help="which candidates (default: steps)")
    add_interleaved_arguments(parser, repetitions=40, rounds=6, max_seconds=1.0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("python -m flashattn.measure.forward_candidates needs a CUDA GPU")
    variants = SETS[args.set]
    for name in variants:                          # every build before the first timing
        variant_module(name)
    names = list(variants)
    print(f"# v8 forward candidates ({args.set}) on {torch.cuda.get_device_name()}: bf16, median µs of one "
          f"interleaved run per shape; FA4 / build above 1: the build is faster than FlashAttention-4")
    print(f"\n| B, H_q/H_kv, N, D | causal | {' | '.join(names)} | FA4 | "
          f"{' | '.join('FA4 / ' + n for n in names)} |\n|---|---|{'--:|' * (2 * len(names) + 1)}")
    for shape in SHAPES[args.set]:
        print(row(shape, variants, args)[0], flush=True)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
