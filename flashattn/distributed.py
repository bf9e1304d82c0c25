"""Ring attention over torch.distributed: attention over a sequence sharded across the ranks of a process group.

    from flashattn import ring
    from flashattn.distributed import multicast_off, ring_attention
    multicast_off()                                    # before init_process_group, in every process
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    q, k, v = (ring.shard(t, rank, world, causal=True) for t in (q_full, k_full, v_full))
    o = ring_attention(q, k, v, causal=True)           # this rank's rows of the full sequence's attention
    o.sum().backward()                                 # dq, dk, dv of this rank's shard

Each rank holds q, k, v [B, H, L/W, D]: contiguous positions without a mask; with causal=True the zigzag shard
(chunks r and 2W-1-r of 2W, see flashattn.ring), which gives every rank the same work at every step.
`ring.shard` / `ring.unshard` cut and reassemble a full tensor in the layout expected here.

Forward. W steps. At step s a rank holds the K/V shard of rank r - s; it starts sending that shard to rank
r + 1 and receiving the next one from rank r - 1 (one `batch_isend_irecv`), computes its block
(`ring.local_block`: the query rows and keys the mask leaves) with the kernel's forward_lse, merges (o, lse)
by log-sum-exp into its float32 accumulators (`ring.merge`), and only then waits for the transfer: the
communication runs under the compute.

Backward. K/V go around again. Each block's dq, dk, dv come from the FINAL o and lse (P = exp(S * scale -
lse_final), D_i = rowsum(dO_i * O_final)), so every block's share is exact with no rescaling afterwards. dq
sums locally; the float32 dk/dv accumulators of the shard a rank holds travel with it, one step behind the
K/V, and a last hop brings them home to the shard's owner.

Versions: "v6", "v7", "v8" run the project's kernels (torch.ops.flashattn.attention_forward / _backward, bf16
or fp16 on CUDA, D in {64, 128}); "reference" runs flashattn.ring's float64 attention in their place (any
device and float dtype: what the gloo tests on CPUs use). Every rank must make the same calls: a rank that
skips the backward leaves the others waiting.
"""
from __future__ import annotations

import datetime
import functools
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashattn import ring
from flashattn.autograd import BACKWARD_DTYPES, TRAINING_VERSIONS, attention_backward, attention_forward
from flashattn.validate import check_inputs

# NVLink SHARP (multicast) stays off on the lent machines (KINDS.md): NCCL reads these when it creates its
# communicators, so they must be in the environment of every process before the first collective.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
VERSIONS: tuple[str, ...] = ("reference",) + TRAINING_VERSIONS
KV_TAG, GRAD_TAG = 0, 2        # gloo matches messages by tag: K, V are 0, 1 and their gradients 2, 3


def multicast_off(env=None):
    """Put MULTICAST_OFF into `env` (os.environ by default) and return it: call it before
    init_process_group in every process, and pass the result to any subprocess."""
    env = os.environ if env is None else env
    env.update(MULTICAST_OFF)
    return env


# ------------------------------------------------------------------------------------------ the ring
class Ring:
    """This rank's place on the ring of `group` (the default group for None): it sends to the next rank and
    receives from the previous one."""

    def __init__(self, group=None):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ring_attention needs torch.distributed initialised: call "
                               "torch.distributed.init_process_group first (nccl for CUDA tensors, gloo for CPU)")
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
        self.next, self.prev = ranks[(self.rank + 1) % self.world], ranks[(self.rank - 1) % self.world]
        self.backend = str(dist.get_backend(group))

    def pass_on(self, tensors, tag: int):
        """Start sending `tensors` to the next rank and receiving as many from the previous one: (the receive
        buffers, the work to wait on). On a ring of one rank the tensors come straight back."""
        if self.world == 1:
            return list(tensors), []
        tensors = [t.contiguous() for t in tensors]
        got = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, tag + i) for i, t in enumerate(tensors)]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group, tag + i) for i, t in enumerate(got)]
        return got, dist.batch_isend_irecv(ops)


def wait(works) -> None:
    """Wait for a transfer (on NCCL: the current stream waits; the host goes on)."""
    for w in works:
        w.wait()


# ------------------------------------------------------------------------------------ the local blocks
def kernel_forward(version: str, q, k, v, causal: bool):
    return attention_forward(q, k, v, causal, version, False)


def kernel_backward(version: str, deterministic: bool, q, k, v, o, lse, do, causal: bool):
    # The binding's first kernel (bwd_prep, in kernels/v6_backward.cu and v8_backward.cu alike) computes
    # D_i = rowsum(dO_i * O_i) from the o it is given and P from the lse it is given: passed the final o and
    # lse it gives this block's exact share of the gradients.
    return attention_backward(q, k, v, o, lse, do, causal, version, deterministic)


def local_ops(version: str, deterministic: bool):
    """(forward, backward, accumulator dtype) of one block for `version`."""
    if version == "reference":
        return ring.reference_local, ring.reference_local_backward, torch.float64
    return (functools.partial(kernel_forward, version), functools.partial(kernel_backward, version, deterministic),
            torch.float32)


def ring_forward(q, k, v, ring_: Ring, causal: bool, attend):
    """(o, lse) of this rank's query rows against every rank's keys, o in the accumulator dtype."""
    L, o, lse, kv = q.shape[2], None, None, (k.contiguous(), v.contiguous())
    for step in range(ring_.world):
        last = step == ring_.world - 1
        if not last:
            incoming, works = ring_.pass_on(kv, KV_TAG)
        block = ring.local_block(ring_.rank, step, ring_.world, causal)
        if block is not None:
            rows, keys = block.rows(L), block.keys(L)
            o_b, lse_b = attend(q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys], block.causal)
            if o is None:          # step 0: the rank's own shard, every row
                o, lse = o_b.to(torch.promote_types(o_b.dtype, torch.float32)), lse_b
            else:
                o[:, :, rows], lse[:, :, rows] = ring.merge(o[:, :, rows], lse[:, :, rows], o_b, lse_b)
        if not last:
            wait(works)
            kv = tuple(incoming)
    return o, lse


def ring_backward(do, q, k, v, o, lse, ring_: Ring, causal: bool, attend_backward, acc):
    """(dq, dk, dv) in `acc` of this rank's shard: dq summed here, dk and dv brought home by the ring."""
    L, kv, dq, dkv, arriving = q.shape[2], (k.contiguous(), v.contiguous()), None, None, None
    for step in range(ring_.world):
        last = step == ring_.world - 1
        if not last:
            incoming, works = ring_.pass_on(kv, KV_TAG)
        block = ring.local_block(ring_.rank, step, ring_.world, causal)
        if block is not None:
            rows, keys = block.rows(L), block.keys(L)
            dq_b, dk_b, dv_b = attend_backward(q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys], o[:, :, rows],
                                               lse[:, :, rows], do[:, :, rows], block.causal)
        if arriving is None:       # step 0: the own shard, every row and key; its accumulators start here
            dq, dkv = dq_b.to(acc), [dk_b.to(acc), dv_b.to(acc)]
        else:
            dkv, grad_works = arriving
            wait(grad_works)
            if block is not None:
                dq[:, :, rows] += dq_b
                dkv[0][:, :, keys] += dk_b
                dkv[1][:, :, keys] += dv_b
        arriving = ring_.pass_on(dkv, GRAD_TAG)     # the shard's next holder adds its share; after W hops: home
        if not last:
            wait(works)
            kv = tuple(incoming)
    dkv, grad_works = arriving
    wait(grad_works)
    return dq, dkv[0], dkv[1]


def head_groups(H: int, head_chunk: int | None) -> list[slice]:
    step = H if head_chunk is None else head_chunk
    return [slice(h, min(h + step, H)) for h in range(0, H, step)]


class RingAttention(torch.autograd.Function):
    """The ring's forward and backward, one ring pass per group of `head_chunk` heads."""

    @staticmethod
    def forward(ctx, q, k, v, ring_, causal, version, deterministic, head_chunk):
        attend, attend_backward, acc = local_ops(version, deterministic)
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty(q.shape[:3], dtype=acc, device=q.device)
        for h in head_groups(q.shape[1], head_chunk):
            o_h, lse[:, h] = ring_forward(q[:, h], k[:, h], v[:, h], ring_, causal, attend)
            o[:, h] = o_h
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.ring, ctx.causal, ctx.head_chunk = ring_, causal, head_chunk
        ctx.attend_backward, ctx.acc = attend_backward, acc
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        grads = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v)]
        for h in head_groups(q.shape[1], ctx.head_chunk):
            parts = ring_backward(do[:, h], q[:, h], k[:, h], v[:, h], o[:, h], lse[:, h], ctx.ring, ctx.causal,
                                  ctx.attend_backward, ctx.acc)
            for g, p in zip(grads, parts):
                g[:, h] = p
        return (*grads, None, None, None, None, None)


# ------------------------------------------------------------------------------------------ user API
def check_ring_inputs(q, k, v, causal: bool = False, version: str = "v8", head_chunk: int | None = None,
                      backend: str | None = None) -> None:
    """ValueError or TypeError naming the argument, for what one rank can see without communicating: the
    version, q, k and v of one shape, dtype and device (the kernels' own checks for kernel versions), an even
    local length when causal (two zigzag chunks), head_chunk, and a device the group's backend moves."""
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {', '.join(VERSIONS)}; got {version!r}")
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{arg} must be a torch.Tensor; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{arg} must have rank 4 [B, H, local_len, head_dim]; got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{arg} has dtype {str(t.dtype).replace('torch.', '')}; ring_attention takes floats")
    if version != "reference":
        check_inputs(q, k, v, version, causal)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)) and \
                q.dtype not in BACKWARD_DTYPES:
            raise TypeError(f"q has dtype {str(q.dtype).replace('torch.', '')}; the backward of {version} takes "
                            "bfloat16 and float16")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    for arg, t in (("k", k), ("v", v)):
        if t.shape != q.shape:
            raise ValueError(f"{arg} must have q's shape [B, H, local_len, D] (the same positions of the "
                             f"sequence): q {tuple(q.shape)}, {arg} {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"q, k and v must be on one device; got q on {q.device}, {arg} on {t.device}")
    if q.numel() == 0:
        raise ValueError(f"q has an empty dimension: shape {tuple(q.shape)}")
    if causal and q.shape[2] % 2:
        raise ValueError(f"q has local length {q.shape[2]}; a causal shard is two zigzag chunks, so it must be "
                         "even (the full length divisible by 2 x world; see flashattn.ring.shard)")
    if head_chunk is not None and (isinstance(head_chunk, bool) or not isinstance(head_chunk, int)
                                   or not 1 <= head_chunk):
        raise ValueError(f"head_chunk must be None or an int >= 1; got {head_chunk!r}")
    if backend == "nccl" and not q.is_cuda:
        raise ValueError(f"q is on {q.device}, but the group's backend nccl moves CUDA tensors only")
    if backend == "gloo" and q.is_cuda:
        raise ValueError(f"q is on {q.device}, but the group's backend is gloo; CUDA tensors need nccl")


def ring_attention(q, k, v, group=None, causal: bool = False, version: str = "v8", deterministic: bool = False,
                   head_chunk: int | None = None):
    """softmax(q k^T / sqrt(D)) v over the sequence sharded across `group`'s ranks: this rank's rows.

    q, k, v [B, H, L/W, D]: this rank's shard, contiguous positions for causal=False, the zigzag shard for
    causal=True (`flashattn.ring.shard` makes either); every rank the same shape. Differentiable. `version`:
    "v6", "v7", "v8" (the kernels) or "reference" (float64, any device). `head_chunk` heads per ring pass
    (None: all): smaller passes hold smaller float32 accumulators and transfers. Checks run before any
    communication and name the argument.
    """
    ring_ = Ring(group)
    check_ring_inputs(q, k, v, causal, version, head_chunk, ring_.backend)
    return RingAttention.apply(q, k, v, ring_, causal, version, deterministic, head_chunk)


# ------------------------------------------------------------------------------------- local processes
def free_port() -> int:
    """A TCP port nothing listens on now (the OS's pick), for the rendezvous of run_local's processes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_main(rank: int, fn, world: int, port: int, backend: str, timeout_s: float, args) -> None:
    """One process of run_local: multicast off, join the group (nccl: GPU `rank`), run fn, leave."""
    multicast_off()       # a forked process has the environment of the fork server, not of its caller
    device = None
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), device_id=device)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_local(fn, world: int, args=(), backend: str = "gloo", timeout_s: float = 120.0) -> None:
    """Run fn(rank, world, *args) in `world` processes on this machine, each a rank of one process group of
    `backend` (gloo on CPUs; nccl with one GPU per rank), NVLink multicast off; raises what a process raised.
    `fn` must be importable by name (a module-level function). The processes fork from a server that has
    imported this module once (forkserver), so that each starts in milliseconds instead of importing torch
    again (and `fn`'s module); a collective stuck longer than `timeout_s` fails instead of hanging."""
    # the server imports these once, when it starts (the first call); later calls fork from it as it is
    mp.get_context("forkserver").set_forkserver_preload([__name__, fn.__module__])
    mp.start_processes(process_main, args=(fn, world, free_port(), backend, timeout_s, tuple(args)), nprocs=world,
                       start_method="forkserver")
