"""The program Nsight Compute counts instructions in: warm-up calls of one forward, then one more inside the NVTX
range "prof", which ncu selects.

    python scripts/ncu_inst.py WHICH B H N D CAUSAL

WHICH is a build of `python -m flashattn.measure.forward_candidates` (default, desc_make, ...) or fa4
(FlashAttention-4, where it imports). results/h200/logs/ncu_inst_16c90d8.raw.txt (tabled in ncu_inst_16c90d8.md)
came from, per build and shape,

    ncu --nvtx --nvtx-include "prof/" --csv --metrics smsp__inst_executed.sum,gpu__time_duration.sum,\
        sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.per_cycle_active,\
        sm__inst_executed_pipe_uniform.sum.pct_of_peak_sustained_active,\
        sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active \
        python3 scripts/ncu_inst.py WHICH B H N D CAUSAL
"""
import sys

import torch

from flashattn.measure import peers
from flashattn.measure.prefill_bench import inputs
from flashattn.validate import aligned

which, B, H, N, D, causal = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6] == "1"
q, k, v = inputs(B, H, H, N, D)
if which == "fa4":
    call = peers.forward_call("fa4", q, k, v, causal)
else:
    from flashattn.measure.forward_candidates import variant_module
    m = variant_module(which)
    call = lambda: m.forward(aligned(q), aligned(k), aligned(v), causal, D ** -0.5, -1, -1)  # noqa: E731
for _ in range(3):
    call()
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("prof")
call()
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
