"""attention_with_kvcache (kernels/decode.cu): against float64 over each sequence's valid cache, within twice
the error SDPA makes in the same dtype; split counts from 1 to more than there are tiles; grouped-query
heads; paged caches; per-sequence lengths including 0; new keys appended in place and nowhere else; bad
arguments refused by name before any launch. The tests that split run every build of BUILDS: the default (a
merge kernel), the one whose last split block merges (DECODE_FUSED_MERGE), whose counters are checked too,
the one whose splits take every splits-th tile (DECODE_INTERLEAVE) and the one whose splits merge as a
cluster (DECODE_CLUSTER_MERGE; the sanitizer target's calls of 3 splits include empty ones)."""
import math

import pytest
import torch
from conftest import poison_allocator, randn, run_sanitized

import flashattn
from flashattn import decode
from flashattn.measure.decode_bench import CLUSTER, FUSED, INTERLEAVED
from flashattn.measure.resources import compile_report
from flashattn.reference import relative_error

gpu = pytest.mark.gpu
# The builds that split, as decode_bench times them (the same modules).
BUILDS = {"merge-kernel": (), "fused-merge": FUSED, "interleaved": INTERLEAVED, "cluster-merge": CLUSTER}


@pytest.fixture(params=list(BUILDS))
def attend(request):
    """attention_with_kvcache of one build of BUILDS."""
    flags = BUILDS[request.param]
    return decode.variant(flags) if flags else flashattn.attention_with_kvcache


def check(q, k_cache, v_cache, lengths, causal, out, scale=None, block_table=None):
    """ours within twice SDPA's own error against float64; rows that see no key are exactly 0."""
    ref = decode.reference(q, k_cache, v_cache, lengths, block_table, causal, scale)
    theirs = relative_error(decode.sdpa_reference(q, k_cache, v_cache, lengths, block_table, causal, scale), ref)
    ours = relative_error(out, ref)
    assert math.isfinite(ours) and ours <= 2 * theirs + 1e-6, (ours, theirs)
    empty = ref.abs().amax(dim=-1) == 0
    assert (out[empty] == 0).all()


def caches(B, N, H_kv, D, dtype):
    return randn(B, N, H_kv, D, dtype=dtype), randn(B, N, H_kv, D, dtype=dtype)


# (B, M, H_q, H_kv, N): one key, odd lengths, a long cache, several new rows, grouped heads
SHAPES = [(1, 1, 2, 2, 1), (2, 1, 4, 4, 17), (3, 1, 8, 2, 1023), (1, 3, 6, 3, 113), (2, 16, 4, 4, 2049),
          (1, 1, 32, 8, 32769)]


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}M{}H{}/{}N{}".format(*s))
@pytest.mark.parametrize("causal", [False, True])
def test_matches_float64(dtype, D, shape, causal, attend):
    B, M, H_q, H_kv, N = shape
    q = randn(B, M, H_q, D, dtype=dtype)
    k_cache, v_cache = caches(B, N, H_kv, D, dtype)
    poison_allocator(q)
    out = attend(q, k_cache, v_cache, causal=causal)
    check(q, k_cache, v_cache, [N] * B, causal, out)


@gpu
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 64, 128])
def test_every_split_count(num_splits, attend):
    """From one split to more splits than the 17 tiles of the cache (the binding then uses one per tile)."""
    B, M, H, D, N = 2, 2, 4, 128, 1050
    q = randn(B, M, H, D, dtype=torch.bfloat16)
    k_cache, v_cache = caches(B, N, H, D, torch.bfloat16)
    out = attend(q, k_cache, v_cache, causal=True, num_splits=num_splits)
    check(q, k_cache, v_cache, [N] * B, True, out)


@gpu
@pytest.mark.parametrize("num_splits", [0, 1, 5, 40])
def test_lengths_per_sequence(num_splits, attend):
    """Lengths 0 to 3000 in one batch: short sequences leave whole splits empty, length 0 gives zeros."""
    lengths = [0, 1, 17, 3000, 64, 1023, 0, 2]
    B, H_q, H_kv, D = len(lengths), 8, 2, 128
    q = randn(B, 1, H_q, D, dtype=torch.bfloat16)
    k_cache, v_cache = caches(B, 3000, H_kv, D, torch.bfloat16)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = attend(q, k_cache, v_cache, cache_seqlens=seqlens, num_splits=num_splits)
    assert (out[0] == 0).all() and (out[6] == 0).all()
    check(q, k_cache, v_cache, lengths, True, out)


@gpu
@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_paged_cache_equals_contiguous(page_size, attend):
    """The same keys in shuffled pages give bit-for-bit the contiguous cache's output."""
    B, M, H_q, H_kv, D, N = 3, 2, 8, 4, 128, 1000
    lengths = torch.tensor([1000, 517, 1], dtype=torch.int32, device="cuda")
    q = randn(B, M, H_q, D, dtype=torch.bfloat16)
    k_cache, v_cache = caches(B, N, H_kv, D, torch.bfloat16)
    pages_per_seq = math.ceil(N / page_size)
    order = torch.randperm(B * pages_per_seq, device="cuda").to(torch.int32)
    block_table = order.view(B, pages_per_seq)
    k_pages = torch.full((B * pages_per_seq, page_size, H_kv, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    v_pages = k_pages.clone()
    padded = pages_per_seq * page_size
    for cache, pages in ((k_cache, k_pages), (v_cache, v_pages)):
        full = torch.zeros(B, padded, H_kv, D, dtype=torch.bfloat16, device="cuda")
        full[:, :N] = cache
        pages[block_table.flatten().long()] = full.view(B * pages_per_seq, page_size, H_kv, D)
    for splits in (1, 4):
        flat = attend(q, k_cache, v_cache, cache_seqlens=lengths, num_splits=splits)
        paged = attend(q, k_pages, v_pages, cache_seqlens=lengths, block_table=block_table, num_splits=splits)
        assert torch.equal(flat, paged)
    check(q, k_pages, v_pages, lengths.tolist(), True, paged, block_table=block_table)


@gpu
@pytest.mark.parametrize("paged", [False, True])
def test_append_lands_where_lengths_say(paged):
    """New k, v go to positions L_b .. L_b + M_new - 1 of each sequence and nowhere else (a NaN-poisoned
    cache keeps its NaNs everywhere else), and the attention then reads them."""
    B, M, H_q, H_kv, D, cap = 3, 3, 4, 2, 64, 256
    lengths = [5, 0, 200]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q = randn(B, M, H_q, D, dtype=torch.bfloat16)
    k_new, v_new = randn(B, M, H_kv, D, dtype=torch.bfloat16), randn(B, M, H_kv, D, dtype=torch.bfloat16)
    k_cache = torch.full((B, cap, H_kv, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    v_cache = k_cache.clone()
    for b, L in enumerate(lengths):                    # valid history; NaN past it
        k_cache[b, :L] = randn(L, H_kv, D, dtype=torch.bfloat16)
        v_cache[b, :L] = randn(L, H_kv, D, dtype=torch.bfloat16)
    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    for b, L in enumerate(lengths):
        expect_k[b, L:L + M], expect_v[b, L:L + M] = k_new[b], v_new[b]
    block_table = None
    if paged:                                          # pages of 64 rows, sequence b on pages [4b .. 4b + 3] reversed
        block_table = torch.tensor([[4 * b + 3 - i for i in range(4)] for b in range(B)], dtype=torch.int32,
                                   device="cuda")
        k_store, v_store = (torch.empty(4 * B, 64, H_kv, D, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        for store, src in ((k_store, k_cache), (v_store, v_cache)):
            store[block_table.flatten().long()] = src.view(4 * B, 64, H_kv, D)
        k_cache, v_cache = k_store, v_store
    out = flashattn.attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=seqlens,
                                           block_table=block_table)
    if paged:
        k_cache, v_cache = (s[block_table.flatten().long()].view(B, cap, H_kv, D) for s in (k_cache, v_cache))
    for got, expect in ((k_cache, expect_k), (v_cache, expect_v)):
        assert torch.equal(got.isnan(), expect.isnan())
        assert torch.equal(got.nan_to_num(7.0), expect.nan_to_num(7.0))
    check(q, expect_k, expect_v, [L + M for L in lengths], True, out)


@gpu
def test_int_lengths_and_append():
    """An int cache_seqlens (no device-to-host copy) appends and attends like the tensor form."""
    B, H, D, cap = 2, 4, 128, 300
    q = randn(B, 1, H, D, dtype=torch.bfloat16)
    k_cache, v_cache = caches(B, cap, H, D, torch.bfloat16)
    k_new, v_new = randn(B, 1, H, D, dtype=torch.bfloat16), randn(B, 1, H, D, dtype=torch.bfloat16)
    k2, v2 = k_cache.clone(), v_cache.clone()
    a = flashattn.attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=99)
    seqlens = torch.full((B,), 99, dtype=torch.int32, device="cuda")
    b = flashattn.attention_with_kvcache(q, k2, v2, k=k_new, v=v_new, cache_seqlens=seqlens)
    assert torch.equal(a, b) and torch.equal(k_cache, k2) and torch.equal(v_cache, v2)
    check(q, k_cache, v_cache, [100, 100], True, a)


@gpu
def test_large_logits_and_scale(attend):
    """Scores in the hundreds (exp overflows without the running max) and an explicit scale."""
    B, M, H, D, N = 2, 4, 4, 128, 777
    q = randn(B, M, H, D, dtype=torch.bfloat16, scale=25.0)
    k_cache, v_cache = caches(B, N, H, D, torch.bfloat16)
    for scale in (None, 0.3):
        out = attend(q, k_cache, v_cache, scale=scale, num_splits=3)
        check(q, k_cache, v_cache, [N] * B, True, out, scale=scale)


@gpu
def test_strided_views():
    """q and the caches as views with other strides (a [B, H, N, D] cache transposed to [B, N, H, D])."""
    B, H, D, N = 2, 4, 64, 300
    k_bhnd, v_bhnd = randn(B, H, N, D, dtype=torch.float16), randn(B, H, N, D, dtype=torch.float16)
    q = randn(B, H, 1, D, dtype=torch.float16).transpose(1, 2)
    out = flashattn.attention_with_kvcache(q, k_bhnd.transpose(1, 2), v_bhnd.transpose(1, 2))
    check(q, k_bhnd.transpose(1, 2), v_bhnd.transpose(1, 2), [N] * B, True, out)


# ------------------------------------------------------------------------ the fused merge's counters

@gpu
def test_fused_merge_calls_in_a_row_each_find_zeroed_counters():
    """Calls of the fused build one after another, each with its own shape, split count and fresh inputs,
    are each right: a counter left non-zero would make the wrong block of the next call merge, or none (the
    output is allocated over NaN). Among them a shape seen before, more counters than any earlier call of
    the test (the buffer may grow), several row blocks per kv head and one split (no counter used)."""
    attend = decode.variant(FUSED)
    # (B, M, H_q, H_kv, N, num_splits)
    for B, M, H_q, H_kv, N, splits in [(1, 16, 32, 32, 4096, 8), (3, 1, 8, 2, 1023, 5), (1, 16, 32, 32, 4096, 8),
                                       (1, 16, 16, 4, 3000, 6), (2, 3, 12, 4, 2049, 0), (8, 1, 32, 8, 1500, 4),
                                       (2, 1, 4, 4, 700, 1), (3, 1, 8, 2, 1023, 64)]:
        q = randn(B, M, H_q, 128, dtype=torch.bfloat16)
        k_cache, v_cache = caches(B, N, H_kv, 128, torch.bfloat16)
        poison_allocator(q)
        out = attend(q, k_cache, v_cache, causal=True, num_splits=splits)
        check(q, k_cache, v_cache, [N] * B, True, out)


@gpu
def test_fused_merge_leaves_its_counters_zero():
    """After a call whose batch has an empty sequence (all its splits empty) and four row blocks per kv head,
    every counter of the device's buffer is back at 0."""
    B, M, H_q, H_kv, D, N = 3, 16, 32, 8, 128, 5000
    q = randn(B, M, H_q, D, dtype=torch.bfloat16)
    k_cache, v_cache = caches(B, N, H_kv, D, torch.bfloat16)
    lengths = [N, 0, 777]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = decode.variant(FUSED)(q, k_cache, v_cache, cache_seqlens=seqlens, num_splits=7)
    torch.cuda.synchronize()
    counters = decode.merge_counters(q.device, B * decode.blocks_per_sequence(M, H_q, H_kv))
    assert counters.numel() >= B * H_kv * 4 and not counters.any()
    check(q, k_cache, v_cache, lengths, True, out)


def test_fused_merge_compiles_for_sm90_without_a_merge_kernel():
    """nvcc alone: the fused build's kernels are split kernels only, none spilling."""
    kernels = compile_report("decode", "90", FUSED)
    assert kernels and all("split_kernel" in k["name"] for k in kernels), [k["name"] for k in kernels]
    assert all(k["spill_store_bytes"] == k["spill_load_bytes"] == 0 for k in kernels), kernels


# ------------------------------------------------------------------------ refused arguments

def cpu_args(**change):
    """Well-formed CPU arguments (refused last, for being on the CPU) with `change` applied."""
    args = dict(q=torch.zeros(2, 1, 8, 64, dtype=BF), k_cache=torch.zeros(2, 32, 4, 64, dtype=BF),
                v_cache=torch.zeros(2, 32, 4, 64, dtype=BF))
    args.update(change)
    return args


BF = torch.bfloat16
REFUSED = {
    "q rank": (dict(q=torch.zeros(1, 8, 64, dtype=BF)), "q must have rank 4"),
    "q dtype": (dict(q=torch.zeros(2, 1, 8, 64)), "q has dtype float32"),
    "head dim": (dict(q=torch.zeros(2, 1, 8, 80, dtype=BF), k_cache=torch.zeros(2, 32, 4, 80, dtype=BF),
                      v_cache=torch.zeros(2, 32, 4, 80, dtype=BF)), "head_dim 80"),
    "mixed dtype": (dict(k_cache=torch.zeros(2, 32, 4, 64, dtype=torch.float16)), "share one dtype"),
    "v_cache shape": (dict(v_cache=torch.zeros(2, 31, 4, 64, dtype=BF)), "v_cache must have the shape"),
    "heads": (dict(q=torch.zeros(2, 1, 6, 64, dtype=BF)), "multiple of k_cache"),
    "batch": (dict(q=torch.zeros(3, 1, 8, 64, dtype=BF)), "k_cache must have q's batch size"),
    "empty q": (dict(q=torch.zeros(2, 0, 8, 64, dtype=BF)), "q has an empty dimension"),
    "k without v": (dict(k=torch.zeros(2, 1, 4, 64, dtype=BF)), "k and v come together"),
    "k shape": (dict(k=torch.zeros(2, 1, 8, 64, dtype=BF), v=torch.zeros(2, 1, 8, 64, dtype=BF)), "k must be"),
    "block_table dtype": (dict(block_table=torch.zeros(2, 1, dtype=torch.int64)), "block_table must be int32"),
    "block_table shape": (dict(block_table=torch.zeros(3, 1, dtype=torch.int32)), "block_table must be"),
    "num_splits": (dict(num_splits=-1), "num_splits must be"),
    "scale": (dict(scale=float("nan")), "scale must be"),
    "cache_seqlens dtype": (dict(cache_seqlens=torch.zeros(2, dtype=torch.int64)), "cache_seqlens must be int32"),
    "cache_seqlens shape": (dict(cache_seqlens=torch.zeros(3, dtype=torch.int32)), "cache_seqlens must have shape"),
    "last dim stride": (dict(k_cache=torch.zeros(2, 32, 64, 4, dtype=BF).transpose(2, 3),
                             v_cache=torch.zeros(2, 32, 64, 4, dtype=BF).transpose(2, 3)), "contiguous in its last"),
    "append without lengths": (dict(k=torch.zeros(2, 1, 4, 64, dtype=BF), v=torch.zeros(2, 1, 4, 64, dtype=BF)),
                               "cache_seqlens is needed"),
    "validate": (dict(validate=1), "validate must be a bool"),
    "cpu": (dict(), "q must be a CUDA tensor"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_before_launch(case):
    """Every structural mistake is named; with no GPU (or on the CPU) nothing is ever launched."""
    change, message = REFUSED[case]
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(")):
        flashattn.attention_with_kvcache(**cpu_args(**change))


@gpu
def test_refused_values_then_next_call_works():
    """Lengths beyond the cache, pages outside the pool, a cache on the wrong device: named, before any
    launch (the poisoned cache stays untouched), and the next good call works."""
    B, H, D, cap = 2, 4, 64, 128
    q = randn(B, 1, H, D, dtype=torch.bfloat16)
    k_cache, v_cache = caches(B, cap, H, D, torch.bfloat16)
    new = randn(B, 1, H, D, dtype=torch.bfloat16)
    before = k_cache.clone()
    with pytest.raises(ValueError, match="cache_seqlens must be in 0..127"):
        flashattn.attention_with_kvcache(q, k_cache, v_cache, k=new, v=new,
                                         cache_seqlens=torch.tensor([3, 128], dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="cache_seqlens must be in"):
        flashattn.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32,
                                                                                          device="cuda"))
    assert torch.equal(k_cache, before)
    pages = k_cache.view(B * 2, 64, H, D), v_cache.view(B * 2, 64, H, D)
    table = torch.tensor([[0, 1], [2, 4]], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="block_table has 1 entries outside 0..3"):
        flashattn.attention_with_kvcache(q, *pages, cache_seqlens=torch.tensor([10, 100], dtype=torch.int32,
                                                                               device="cuda"), block_table=table)
    # the bad page is not used by a sequence of 10 keys: accepted
    flashattn.attention_with_kvcache(q, *pages, cache_seqlens=torch.tensor([10, 10], dtype=torch.int32, device="cuda"),
                                     block_table=table)
    with pytest.raises(ValueError, match="k_cache must be a CUDA tensor"):
        flashattn.attention_with_kvcache(q, k_cache.cpu(), v_cache)
    with pytest.raises(ValueError, match="no backward"):
        flashattn.attention_with_kvcache(q.clone().requires_grad_(), k_cache, v_cache)
    out = flashattn.attention_with_kvcache(q, k_cache, v_cache)
    check(q, k_cache, v_cache, [cap] * B, True, out)


@gpu
def test_unvalidated_values_stay_inside_the_cache():
    """validate=False skips the host copy; with good values it gives the validated result bit for bit, and
    with bad ones (a length past the cache, pages outside the pool) it reads nothing outside the cache."""
    B, H, D, cap = 2, 4, 64, 256
    q = randn(B, 1, H, D, dtype=torch.bfloat16)
    k_cache, v_cache = caches(B, cap, H, D, torch.bfloat16)
    good = torch.tensor([3, 200], dtype=torch.int32, device="cuda")
    assert torch.equal(flashattn.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=good),
                       flashattn.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=good, validate=False))
    bad = torch.tensor([10**6, -7], dtype=torch.int32, device="cuda")
    out = flashattn.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=bad, validate=False)
    pages = k_cache.view(B * 4, 64, H, D), v_cache.view(B * 4, 64, H, D)
    table = torch.tensor([[0, 1, -5, 3], [10**6, 5, 6, 7]], dtype=torch.int32, device="cuda")
    paged = flashattn.attention_with_kvcache(q, *pages, cache_seqlens=good, block_table=table, validate=False)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and torch.isfinite(paged).all()
    assert (out[1] == 0).all()                         # a negative length is clamped to 0 keys


@gpu
def test_binding_refuses_bad_input():
    """The raw binding keeps its own checks for callers that skip the Python ones."""
    mod = decode.module()
    q = randn(1, 1, 4, 64, dtype=torch.bfloat16)
    cache = randn(1, 64, 4, 64, dtype=torch.bfloat16)
    empty = torch.empty(0, dtype=torch.int32, device="cuda")
    for bad in (dict(q=q.float()), dict(q=q.cpu()), dict(k_cache=randn(1, 64, 3, 64, dtype=torch.bfloat16)),
                dict(num_splits=0)):
        args = dict(q=q, k_cache=cache, v_cache=cache, seqlens_k=empty, block_table=empty, max_seqlen_k=64,
                    scale=0.125, causal=True, num_splits=1, counters=empty) | bad
        with pytest.raises(RuntimeError):
            mod.decode(*args.values())
    # the fused build counts only where it splits, and then on enough counters
    long = randn(1, 256, 4, 64, dtype=torch.bfloat16)
    call = dict(q=q, k_cache=long, v_cache=long, seqlens_k=empty, block_table=empty, max_seqlen_k=256, scale=0.125,
                causal=True)
    fused = decode.module(FUSED)
    fused.decode(*call.values(), 1, empty)
    with pytest.raises(RuntimeError, match="counters must be int32"):
        fused.decode(*call.values(), 2, empty)


# ------------------------------------------------------------------------ the split rule

def test_split_rule():
    """The shortest split whose blocks fit one wave of two blocks per SM; at least 4 tiles; at most 128."""
    rule = decode.choose_num_splits
    assert rule(512, 32, sms=132) == 8                 # 1 sequence x 32 heads, 32k keys: 8 x 32 = 256 <= 264
    assert rule(256, 256, sms=132) == 1                # 8 x 32 heads: one wave already
    assert rule(256, 100, sms=132) == 2
    assert rule(6, 1, sms=132) == 1                    # too short to split
    assert rule(10**6, 1, sms=132) == 128
    assert rule([512], 32, sms=132) == 8               # a list of one length agrees with the int form
    # lengths 1 .. 32k (in 64-key tiles) x 8 kv heads: splits of 37 tiles -> 31 sequences' worth of blocks
    spread = [1, 5, 16, 32, 64, 128, 256, 512]
    n = rule(spread, 8, sms=132)
    per_split = -(-512 // n)
    assert 8 * sum(-(-t // per_split) for t in spread) <= 264
    assert 8 * sum(-(-t // (per_split - 1)) for t in spread) > 264     # and no shorter split would fit
    assert rule([0, 0], 8, sms=132) == 1 and rule([], 8, sms=132) == 1


@gpu
@pytest.mark.parametrize("build", list(BUILDS))
def test_sanitizer_clean(build):
    flags = BUILDS[build]
    if flags:                                          # build outside the sanitizer: nvcc under it is slow
        decode.module(flags)
    else:
        decode.module()
    for tool in ("memcheck", "racecheck", "synccheck"):
        _, ran = run_sanitized(tool, "decode_sanitizer_target.py", *flags)
        assert len(ran) >= 8, ran


def test_split_count_of_a_call():
    """splits_for: blocks per sequence are kv heads x 16-row blocks of packed rows, and a list of lengths
    schedules by tiles that hold keys."""
    assert decode.blocks_per_sequence(M=1, H_q=32, H_kv=8) == 8 and decode.blocks_per_sequence(4, 64, 8) == 16
    assert decode.splits_for(1, 16, 32, 32, 32768, 64, sms=132) == decode.choose_num_splits(512, 32, 132) == 8
    spread = [1, 300, 1000, 2048, 4096, 8192, 16384, 32768]
    assert decode.splits_for(8, 1, 32, 8, spread, 64, sms=132) == decode.choose_num_splits(
        [-(-n // 64) for n in spread], 8, 132)


def test_references_read_pages_like_the_cache():
    """On the CPU: the float64 reference and SDPA's give the same output through a shuffled page pool as
    through the contiguous cache, rows with no key are 0, and SDPA's bf16 stays near float64."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 2, 4, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(3, 70, 2, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    lengths = [70, 0, 33]
    kp, vp, table = decode.paged_copy(k, v, 16, generator=g)
    assert table.shape == (3, 5) and sorted(table.flatten().tolist()) == list(range(15))
    for fn in (decode.reference, decode.sdpa_reference):
        flat, paged = fn(q, k, v, lengths), fn(q, kp, vp, lengths, table)
        assert torch.equal(flat, paged) and (flat[1] == 0).all()
    assert relative_error(decode.sdpa_reference(q, k, v, lengths), decode.reference(q, k, v, lengths)) < 1e-2
