"""Attention against a KV cache, for generation: `attention_with_kvcache` (kernels/decode.cu).

    import flashattn
    out = flashattn.attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lengths)

The conventions are FlashAttention's `flash_attn_with_kvcache`:

* q [B, M, H_q, D]: the M new tokens of each sequence (M = 1 when generating one token at a time);
* k_cache, v_cache [B, max_len, H_kv, D], or paged [num_pages, page_size, H_kv, D] with an int32
  block_table [B, pages_per_seq] that lists each sequence's pages in order;
* k, v [B, M_new, H_kv, D] (optional): new keys and values, written into the cache in place at positions
  cache_seqlens[b] .. cache_seqlens[b] + M_new - 1 before the attention reads it;
* cache_seqlens: how many tokens each sequence already holds (an int for all, or an int32 tensor [B]);
  sequence b attends to its first cache_seqlens[b] + M_new keys (all max_len keys when it is None);
* H_q a multiple of H_kv (grouped-query attention); causal=True aligns the mask bottom-right (new row m sees
  key j iff j <= L_b - M + m); scale defaults to 1/sqrt(D);
* num_splits: how many blocks share one sequence's keys (split-KV); 0 lets `choose_num_splits` decide. The
  splits are cut from the longest sequence, or from the cache's capacity when `validate=False` leaves a
  lengths tensor unread.

Every argument is checked before anything runs (ValueError or TypeError naming it). Checking lengths and
page numbers held in GPU tensors needs their values: one device-to-host copy per call, which waits for the
GPU to finish its queue (an int `cache_seqlens` and no block table need none). `validate=False` skips
those value checks, for CUDA graphs and loops that know their lengths and pages are right; the kernel then
still reads nothing outside the cache (a length is clamped to the capacity, a page number to the pool),
but a wrong value gives a wrong result. The function is for inference: inputs that require grad are
refused rather than silently cut from the graph.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from flashattn.loader import KERNEL_FUNCTIONS, build

HEAD_DIMS = (64, 128)
DTYPES = (torch.bfloat16, torch.float16)
ROWS_PER_BLOCK = 16            # packed rows (new token x query head of a group) of one block's mma tile
MAX_SPLITS = 128
MIN_TILES_PER_SPLIT = 4        # each split streams at least this many tiles (see choose_num_splits)
BLOCKS_PER_SM = 2              # split blocks resident per SM (kernels/decode.cu: 2 by registers and smem)


@functools.cache
def module(extra_cuda_cflags: tuple[str, ...] = (), functions: tuple[str, ...] = KERNEL_FUNCTIONS["decode"]):
    """kernels/decode.cu built (bindings `decode` and `tile_keys`, or `functions`); `extra_cuda_cflags`
    (e.g. ("-DDECODE_STAGES=4",)) builds a variant beside the default one."""
    name = "flashattn_decode" + "".join(f"_{f.lstrip('-D').replace('=', '')}" for f in extra_cuda_cflags)
    return build("decode", extra_cuda_cflags=list(extra_cuda_cflags), functions=functions, module_name=name)


@functools.cache
def _sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _no_tensor(device) -> torch.Tensor:
    """The empty int32 tensor that tells the binding "no per-sequence lengths" or "not paged"."""
    return torch.empty(0, dtype=torch.int32, device=device)


# Per device, the fused merge's arrival counters (kernels/decode.cu, DECODE_FUSED_MERGE), newest last.
_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}


def merge_counters(device, n: int) -> torch.Tensor:
    """At least `n` int32 counters on `device`, zero: the split blocks of a fused-merge build count their
    arrivals there, one counter per (sequence, kv head, row block), and the last block of each sets its
    counter back to 0. So the buffer is zeroed once, when it is made, and never again: zeroing it per call
    would be the launch the fused merge exists to save. A build without the fused merge never reads it.

    One buffer per device, shared by every call: safe for calls made one after another, on one stream or on
    several used in turn. Two calls that may run at the same time on different streams would count on the
    same counters, and must not be made; a buffer per stream would allow them, but would have every new
    stream, a CUDA graph's capture stream among them, make its buffer on its first call. A buffer that
    grows is replaced by one twice as large and the old one is kept, not freed: a CUDA graph may hold its
    address. Made during a capture, where torch.zeros is recorded and not run, a buffer is zero only in the
    graph's replays: it serves that call and is not kept (a call before the capture avoids the extra fill)."""
    held = _COUNTERS.setdefault(torch.device(device), [])
    if held and held[-1].numel() >= n:
        return held[-1]
    fresh = torch.zeros(max(n, 2 * held[-1].numel() if held else n), dtype=torch.int32, device=device)
    if not torch.cuda.is_current_stream_capturing():
        held.append(fresh)
    return fresh


def blocks_per_sequence(M: int, H_q: int, H_kv: int) -> int:
    """Blocks of the split kernel one sequence needs per split: one per kv head and 16 packed rows."""
    return H_kv * math.ceil(M * (H_q // H_kv) / ROWS_PER_BLOCK)


def splits_for(B: int, M: int, H_q: int, H_kv: int, lengths, tile: int, sms: int) -> int:
    """`choose_num_splits` for a call: `lengths` every sequence's keys (a list) or the one length they share
    (an int), `tile` the kernel's keys per tile."""
    blocks = blocks_per_sequence(M, H_q, H_kv)
    if isinstance(lengths, int):
        return choose_num_splits(-(-lengths // tile), B * blocks, sms)
    return choose_num_splits([-(-n // tile) for n in lengths], blocks, sms)


def choose_num_splits(seq_tiles, blocks_per_seq: int, sms: int, blocks_per_sm: int = BLOCKS_PER_SM) -> int:
    """How many splits of the keys: `seq_tiles` is every sequence's number of key tiles (a list), or one int
    when they all have the same; `blocks_per_seq` the blocks a sequence needs without splitting (kv heads x
    row blocks); `sms` the GPU's SMs.

    The rule: the shortest split whose blocks all fit in one wave of the GPU's block slots (blocks_per_sm x
    sms), never shorter than MIN_TILES_PER_SPLIT tiles. Every block then streams at most that many tiles
    and none waits for a second wave; a second, partial wave would run with most SMs idle (1.2 waves cost
    about as much as 2), and a split shorter than a few tiles pays its prologue and adds a partial output to
    the merge for little work. Short sequences use fewer splits than long ones (their blocks past the last
    key return at once), so a batch of uneven lengths is balanced by its total length, not its longest.
    The Decoding chapter measures this rule against a sweep of fixed split counts."""
    slots = sms * blocks_per_sm
    uniform = isinstance(seq_tiles, int)
    longest = seq_tiles if uniform else max(seq_tiles, default=0)
    if blocks_per_seq < 1 or longest < 1:
        return 1
    if uniform:                               # B sequences of n tiles: closed form (B folded into blocks_per_seq)
        fill = slots // blocks_per_seq
        return max(1, min(fill, longest // MIN_TILES_PER_SPLIT, MAX_SPLITS))

    def blocks(per_split):                    # blocks with any key when splits are `per_split` tiles long
        return blocks_per_seq * sum(-(-n // per_split) for n in seq_tiles)

    lo, hi = MIN_TILES_PER_SPLIT, max(MIN_TILES_PER_SPLIT, longest)
    while lo < hi:                            # blocks() only falls as splits grow: the shortest that fits
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if blocks(mid) <= slots else (mid + 1, hi)
    return max(1, min(-(-longest // lo), MAX_SPLITS))


def _name(t) -> str:
    return str(t).replace("torch.", "")


def _check_tensor(arg: str, t, rank: int, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{arg} must be a torch.Tensor; got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{arg} must have rank {rank} {layout}; got shape {tuple(t.shape)}")


def _check_cache_arguments(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, num_splits):
    """Types, ranks, dtypes, shapes and devices (the device last, so that every other check runs without a
    GPU); returns (paged, capacity per sequence)."""
    _check_tensor("q", q, 4, "[B, M, H_q, D]")
    _check_tensor("k_cache", k_cache, 4, "[B, max_len, H_kv, D] (paged: [num_pages, page_size, H_kv, D])")
    _check_tensor("v_cache", v_cache, 4, "like k_cache")
    for arg, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype not in DTYPES:
            raise TypeError(f"{arg} has dtype {_name(t.dtype)}; attention_with_kvcache takes bfloat16 and float16")
        if t.numel() == 0:
            raise ValueError(f"{arg} has an empty dimension: shape {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{arg} must be contiguous in its last dimension (head_dim); got strides {t.stride()}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"q, k_cache and v_cache must share one dtype; got {_name(q.dtype)}, "
                        f"{_name(k_cache.dtype)}, {_name(v_cache.dtype)}")
    B, M, H_q, D = q.shape
    if D not in HEAD_DIMS:
        raise ValueError(f"q has head_dim {D}; attention_with_kvcache supports head_dim in {HEAD_DIMS}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have the shape of k_cache: {tuple(k_cache.shape)}; got {tuple(v_cache.shape)}")
    if k_cache.shape[3] != D:
        raise ValueError(f"k_cache must have q's head_dim {D}; got shape {tuple(k_cache.shape)}")
    H_kv = k_cache.shape[2]
    if H_q % H_kv:
        raise ValueError(f"q's heads ({H_q}) must be a multiple of k_cache's ({H_kv}) (grouped-query attention)")
    paged = block_table is not None
    if paged:
        _check_tensor("block_table", block_table, 2, "[B, pages_per_seq]")
        if block_table.dtype != torch.int32:
            raise TypeError(f"block_table must be int32; got {_name(block_table.dtype)}")
        if block_table.shape[0] != B or block_table.shape[1] < 1:
            raise ValueError(f"block_table must be [B={B}, pages_per_seq >= 1]; got {tuple(block_table.shape)}")
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        if k_cache.shape[0] != B:
            raise ValueError(f"k_cache must have q's batch size {B}; got shape {tuple(k_cache.shape)}")
        capacity = k_cache.shape[1]
    if (k is None) != (v is None):
        raise ValueError("k and v come together: pass both new keys and new values, or neither")
    if k is not None:
        for arg, t in (("k", k), ("v", v)):
            _check_tensor(arg, t, 4, "[B, M_new, H_kv, D]")
            if t.dtype != q.dtype:
                raise TypeError(f"{arg} must have q's dtype {_name(q.dtype)}; got {_name(t.dtype)}")
            if t.shape[0] != B or t.shape[2:] != k_cache.shape[2:] or t.shape[1] < 1:
                raise ValueError(f"{arg} must be [B={B}, M_new >= 1, H_kv={H_kv}, D={D}]; got {tuple(t.shape)}")
        if v.shape != k.shape:
            raise ValueError(f"v must have the shape of k {tuple(k.shape)}; got {tuple(v.shape)}")
    _check_lengths(cache_seqlens, B)
    if k is not None and cache_seqlens is None:
        raise ValueError("cache_seqlens is needed to append k and v: it says where each sequence's new tokens go")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0 (or None for 1/sqrt(D)); got {scale!r}")
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or not 0 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be an int in 0..{MAX_SPLITS} (0: chosen by the rule); got {num_splits!r}")
    tensor_lengths = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None
    for arg, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v),
                   ("block_table", block_table), ("cache_seqlens", tensor_lengths)):
        if t is not None and not t.is_cuda:
            raise ValueError(f"{arg} must be a CUDA tensor; got a tensor on {t.device}")
        if t is not None and t.device != q.device:
            raise ValueError(f"{arg} must be on q's device {q.device}; got {t.device}")
    if not q.is_cuda:
        raise ValueError(f"q must be a CUDA tensor; got a tensor on {q.device}")
    for arg, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.data_ptr() % 16 or any(s % 8 for s in t.stride()[:3]):
            raise ValueError(f"{arg} needs 16-byte aligned rows (the kernel copies 16-byte chunks); got strides "
                             f"{t.stride()}")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k_cache, v_cache, k, v)):
        raise ValueError("attention_with_kvcache is for inference and has no backward; run it under torch.no_grad()")
    return paged, capacity


def _check_lengths(cache_seqlens, B: int) -> None:
    if cache_seqlens is None or isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        return
    if not isinstance(cache_seqlens, torch.Tensor):
        raise TypeError(f"cache_seqlens must be None, an int or an int32 tensor [B]; "
                        f"got {type(cache_seqlens).__name__}")
    if cache_seqlens.dtype != torch.int32:
        raise TypeError(f"cache_seqlens must be int32; got {_name(cache_seqlens.dtype)}")
    if cache_seqlens.shape != (B,):
        raise ValueError(f"cache_seqlens must have shape [B={B}]; got {tuple(cache_seqlens.shape)}")


def _check_values(lengths, M_new: int, capacity: int, block_table, page_size: int, num_pages: int,
                  validate: bool = True) -> list[int] | int:
    """Lengths within the cache and used pages within the pool, checked on the host (one device-to-host
    copy when lengths or pages are tensors). Returns every sequence's length after appending (a list) when
    the lengths are a tensor, else the one length all sequences share (an int). validate=False: no copy and
    no check; a lengths tensor is then taken to be the capacity (which only sizes the splits)."""
    every = capacity if lengths is None else lengths + M_new if isinstance(lengths, int) else None
    if not validate and (isinstance(lengths, torch.Tensor) or block_table is not None):
        return capacity if every is None else every
    stats = []
    if block_table is not None:
        total = (lengths + M_new if isinstance(lengths, torch.Tensor) else
                 torch.full((block_table.shape[0],), every, dtype=torch.int32, device=block_table.device))
        pages_used = (total + page_size - 1) // page_size
        used = torch.arange(block_table.shape[1], device=block_table.device) < pages_used[:, None]
        stats.append((((block_table < 0) | (block_table >= num_pages)) & used).sum().view(1))
    if isinstance(lengths, torch.Tensor):
        stats.append(lengths.to(torch.int64))
    values = torch.cat(stats).tolist() if stats else []
    bad_pages = values.pop(0) if block_table is not None else 0
    if isinstance(lengths, torch.Tensor):
        lo, hi = min(values), max(values)
    elif lengths is not None:
        lo = hi = lengths
    if lengths is not None and (lo < 0 or hi + M_new > capacity):
        raise ValueError(f"cache_seqlens must be in 0..{capacity - M_new} (cache capacity {capacity} minus {M_new} new "
                         f"tokens); got values in {lo}..{hi}")
    if bad_pages:
        raise ValueError(f"block_table has {bad_pages} entries outside 0..{num_pages - 1} among the pages the "
                         f"sequences use")
    return [n + M_new for n in values] if isinstance(lengths, torch.Tensor) else every


def _append(k_cache, v_cache, k, v, lengths, block_table) -> None:
    """Write k, v [B, M_new, H_kv, D] into the caches at positions lengths[b] + 0 .. M_new - 1 (one
    index_put per cache)."""
    B, M_new = k.shape[:2]
    if isinstance(lengths, int) and block_table is None:        # one slice copy per cache, no index tensors
        k_cache[:, lengths:lengths + M_new] = k
        v_cache[:, lengths:lengths + M_new] = v
        return
    start = (torch.full((B,), lengths, dtype=torch.int64, device=k.device) if isinstance(lengths, int)
             else lengths.to(torch.int64))
    pos = start[:, None] + torch.arange(M_new, device=k.device)            # [B, M_new]
    if block_table is None:
        index = (torch.arange(B, device=k.device)[:, None].expand(B, M_new), pos)
    else:
        page_size = k_cache.shape[1]
        index = (block_table.gather(1, pos // page_size).to(torch.int64), pos % page_size)
    k_cache.index_put_(index, k)
    v_cache.index_put_(index, v)


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                           causal: bool = True, scale: float | None = None, num_splits: int = 0,
                           validate: bool = True):
    """softmax(scale * q K^T) V over each sequence's cached keys, after appending k, v; see the module doc."""
    return _attention(module(), q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, num_splits,
                      validate)


def variant(extra_cuda_cflags: tuple[str, ...]):
    """attention_with_kvcache running kernels/decode.cu built with `extra_cuda_cflags` (the chapter's steps)."""
    return bound(lambda: module(tuple(extra_cuda_cflags)))


def bound(get_module):
    """attention_with_kvcache running the build that `get_module()` returns (built at the first call)."""
    def call(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, causal=True, scale=None,
             num_splits=0, validate=True):
        return _attention(get_module(), q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale,
                          num_splits, validate)
    return call


def _attention(mod, q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale, num_splits, validate):
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be a bool; got {type(validate).__name__}")
    paged, capacity = _check_cache_arguments(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, scale,
                                             num_splits)
    B, M, H_q, D = q.shape
    lengths = cache_seqlens
    M_new = 0 if k is None else k.shape[1]
    after = _check_values(lengths, M_new, capacity, block_table, k_cache.shape[1], k_cache.shape[0], validate)
    longest = max(after, default=0) if isinstance(after, list) else after
    if k is not None:
        _append(k_cache, v_cache, k, v, lengths, block_table)
    # every sequence as long as `longest` needs no lengths tensor (an int cache_seqlens, or none)
    seqlens = lengths + M_new if isinstance(lengths, torch.Tensor) and M_new else lengths
    if not isinstance(seqlens, torch.Tensor):
        seqlens = _no_tensor(q.device)
    if num_splits == 0:
        num_splits = splits_for(B, M, H_q, k_cache.shape[2], after, mod.tile_keys(), _sm_count(q.device))
    return mod.decode(q, k_cache, v_cache, seqlens.contiguous(),
                      _no_tensor(q.device) if block_table is None else block_table, longest,
                      1.0 / math.sqrt(D) if scale is None else float(scale), causal, num_splits,
                      merge_counters(q.device, B * blocks_per_sequence(M, H_q, k_cache.shape[2])))


def paged_copy(k_cache, v_cache, page_size: int, generator=None):
    """(k_pages, v_pages, block_table): the caches [B, N, H_kv, D] cut into pages of `page_size` rows (the last
    one of each sequence zero-padded) and stored in a shuffled order, as a serving system's page pool would
    hold them; `generator` draws the order. For benchmarks and the book."""
    B, N = k_cache.shape[:2]
    per_seq = math.ceil(N / page_size)
    order = torch.randperm(B * per_seq, device=k_cache.device, generator=generator).to(torch.int32)
    pages = []
    for cache in (k_cache, v_cache):
        padded = torch.zeros(B, per_seq * page_size, *cache.shape[2:], dtype=cache.dtype, device=cache.device)
        padded[:, :N] = cache
        pool = torch.empty(B * per_seq, page_size, *cache.shape[2:], dtype=cache.dtype, device=cache.device)
        pool[order.long()] = padded.view(B * per_seq, page_size, *cache.shape[2:])
        pages.append(pool)
    return pages[0], pages[1], order.view(B, per_seq)


def _sequences(q, k_cache, v_cache, cache_seqlens, block_table, causal: bool):
    """Per sequence b with at least one key: (b, its valid keys, values [L, H_kv, D], the causal mask [M, L]
    or None), read through the block table when there is one."""
    M = q.shape[1]
    for b in range(q.shape[0]):
        if block_table is None:
            keys, values = k_cache[b], v_cache[b]
        else:
            keys, values = (c[block_table[b].long()].flatten(0, 1) for c in (k_cache, v_cache))
        L = keys.shape[0] if cache_seqlens is None else int(cache_seqlens[b])
        if L == 0:
            continue
        visible = None
        if causal:
            visible = torch.arange(L, device=q.device)[None, :] <= (L - M + torch.arange(M, device=q.device))[:, None]
        yield b, keys[:L], values[:L], visible


def reference(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal: bool = True,
              scale: float | None = None) -> torch.Tensor:
    """float64 attention over each sequence's valid cache (after any append), [B, M, H_q, D] like q; a row
    that sees no key is 0. Slow and simple: the tests' yardstick."""
    B, M, H_q, D = q.shape
    H_kv = k_cache.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(B, M, H_q, D, dtype=torch.float64, device=q.device)
    for b, keys, values, visible in _sequences(q, k_cache, v_cache, cache_seqlens, block_table, causal):
        kk = keys.double().repeat_interleave(H_q // H_kv, dim=1).transpose(0, 1)       # [H_q, L, D]
        vv = values.double().repeat_interleave(H_q // H_kv, dim=1).transpose(0, 1)
        s = (q[b].double().transpose(0, 1) @ kk.transpose(1, 2)) * scale                  # [H_q, M, L]
        if visible is not None:
            s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)                                       # rows with no key: 0
        out[b] = (p @ vv).transpose(0, 1)
    return out


def sdpa_reference(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal: bool = True,
                   scale: float | None = None) -> torch.Tensor:
    """What PyTorch's SDPA gives in q's dtype on the same valid caches, sequence by sequence (grouped heads
    through enable_gqa, the bottom-right causal mask explicit): the error a kernel is allowed is measured
    against this one's."""
    out = torch.zeros_like(q)
    for b, keys, values, visible in _sequences(q, k_cache, v_cache, cache_seqlens, block_table, causal):
        o = F.scaled_dot_product_attention(q[b].transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                           values.transpose(0, 1)[None], attn_mask=visible, scale=scale,
                                           enable_gqa=q.shape[2] != keys.shape[1])
        out[b] = o[0].transpose(0, 1).nan_to_num(0.0)
    return out
