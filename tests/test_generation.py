"""The decoding demonstration (flashattn.book.generation): its KV-cache path reproduces the full model, every
attention's wiring (layouts, cache positions, lengths) through CPU stand-ins that implement the documented
conventions, the agreement report, argument checks, and on a GPU flashattn's path against SDPA's."""
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import flashattn
from flashattn.book import generation as gen
from flashattn.book.training_model import Config, build_model
from flashattn.measure import results


def tiny_model(**kw):
    """vocab 50, 2 layers, 2 heads of D=8, context 32, float32 on the CPU; heads (2) and lengths differ, so a
    swapped layout fails a shape check instead of passing by accident."""
    return build_model(Config(**dict(dict(vocab_size=50, block_size=32, n_layer=2, n_head=2, head_dim=8), **kw)),
                       "sdpa").eval()


def bottom_right_causal(q, k, v):
    """Attention of q (B, H, M, D) over k, v (B, H, n, D), row i seeing keys j <= n - M + i."""
    M, n = q.shape[2], k.shape[2]
    mask = torch.arange(n)[None, :] <= (n - M + torch.arange(M))[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.fixture
def standins(monkeypatch):
    """flashattn.attention and attention_with_kvcache replaced by PyTorch code with their conventions, and
    FlashAttention-4's varlen function as a module; each call recorded."""
    calls = {"attention": [], "kvcache": [], "fa4": []}

    def attention(q, k, v, causal=False):                     # [B, H, T, D]
        calls["attention"].append(tuple(q.shape))
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, causal=True,
                     scale=None, num_splits=0):                 # q (B, M, H, D), caches (B, max_len, H, D)
        assert isinstance(cache_seqlens, int) and causal and k_cache.shape[2:] == q.shape[2:] == k.shape[2:]
        calls["kvcache"].append((tuple(q.shape), cache_seqlens))
        n = cache_seqlens + k.shape[1]
        k_cache[:, cache_seqlens:n], v_cache[:, cache_seqlens:n] = k, v           # in place, then attend
        return bottom_right_causal(*(t.transpose(1, 2) for t in (q, k_cache[:, :n], v_cache[:, :n]))).transpose(1, 2)

    def varlen(q, k, v, seqused_k=None, causal=False, num_splits=1):
        assert seqused_k.dtype == torch.int32 and seqused_k.shape == (q.shape[0],) and seqused_k.is_contiguous()
        assert causal and len(set(seqused_k.tolist())) == 1 and k.shape[2:] == q.shape[2:]
        calls["fa4"].append((tuple(q.shape), int(seqused_k[0])))
        n = int(seqused_k[0])
        out = bottom_right_causal(*(t.transpose(1, 2) for t in (q, k[:, :n], v[:, :n]))).transpose(1, 2)
        return out, None                                      # (out, lse), as some versions return

    monkeypatch.setattr(flashattn, "attention", attention)
    monkeypatch.setattr(flashattn, "attention_with_kvcache", with_kvcache, raising=False)
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_varlen_func = varlen
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    return calls


# ------------------------------------------------------------------------------------------ the model
def test_the_cached_path_reproduces_the_full_model_at_every_step():
    model = tiny_model()
    tokens = gen.random_prompt(50, 3, 20, seed=1)
    P = 5
    with torch.no_grad():
        full = model(tokens[:, :-1])[:, P - 1:]             # position t predicts token t + 1
    cached = gen.teacher_forced_logits(model, tokens, P, "sdpa")
    assert cached.shape == (3, 20 - P, 50)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-4)


def test_generate_is_greedy_and_its_logits_are_the_teacher_forced_ones():
    model = tiny_model()
    prompt = gen.random_prompt(50, 2, 6, seed=2)
    tokens, logits = gen.generate(model, prompt, 12, "sdpa")
    assert tokens.shape == (2, 18) and logits.shape == (2, 12, 50) and logits.dtype == torch.float32
    assert torch.equal(tokens[:, :6], prompt) and torch.equal(tokens[:, 6:], logits.argmax(-1))
    torch.testing.assert_close(gen.teacher_forced_logits(model, tokens, 6, "sdpa"), logits, atol=0, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(logits, model(tokens[:, :-1])[:, 5:], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("attn", ["flashattn", "fa4"])
def test_every_attention_is_wired_with_its_layout_and_lengths(standins, attn):
    model = tiny_model()
    tokens = gen.random_prompt(50, 3, 14, seed=3)
    expected = gen.teacher_forced_logits(model, tokens, 5, "sdpa")
    torch.testing.assert_close(gen.teacher_forced_logits(model, tokens, 5, attn), expected, atol=1e-5, rtol=1e-4)
    steps = [((3, 1, 2, 8), L) for L in range(5, 13) for _ in range(2)]    # 8 decode steps, 2 layers each
    if attn == "flashattn":
        assert standins["attention"] == [(3, 2, 5, 8)] * 2                    # the prompt, [B, H, T, D]
        assert standins["kvcache"] == steps                                   # q (B, 1, H, D), L before appending
    else:
        assert standins["fa4"] == [((3, 5, 2, 8), 5)] * 2 + [(q, L + 1) for q, L in steps]    # seqused_k: after


def test_the_real_attention_with_kvcache_accepts_the_decode_call_up_to_the_device(monkeypatch):
    """flashattn.attention_with_kvcache checks the device last (flashattn/decode.py), so a CPU call that gets
    as far as "must be a CUDA tensor" passed every shape, dtype, stride and length check."""
    monkeypatch.setattr(flashattn, "attention", lambda q, k, v, causal: F.scaled_dot_product_attention(
        q, k, v, is_causal=causal))                          # the prompt, through PyTorch
    model = tiny_model(n_layer=1, head_dim=64).to(torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA tensor"):
        gen.generate(model, gen.random_prompt(50, 3, 5), 4, "flashattn")


def test_compare_reports_full_agreement_for_identical_math(standins):
    model = tiny_model()
    r = gen.compare(model, gen.random_prompt(50, 2, 4), 10, "flashattn")
    assert r["steps"] == 10 and r["tokens_agreeing"] == [10, 10] and r["sequences_agreeing"] == 2
    assert r["max_rel_logit_diff"] < 1e-5 and r["first_divergences"] == [] and len(r["rel_logit_diff_per_step"]) == 10


# ------------------------------------------------------------------------------------------ agreement
def synthetic(P=3, n=4):
    """Reference logits picking token 0 with margin 3 (scale 4), except sequence 1 at step 2: a near-tie
    (2.0 against 1.99) that the other attention's +0.02 flips to token 1."""
    ref = torch.zeros(2, n, 5)
    ref[:, :, 0], ref[:, :, 1] = 4.0, 1.0
    ref[1, 2, 0], ref[1, 2, 1] = 2.0, 1.99
    other = ref.clone()
    other[1, 2, 1] += 0.02
    tokens_ref = torch.cat([torch.full((2, P), 7), ref.argmax(-1)], 1)
    tokens_other = tokens_ref.clone()
    tokens_other[1, P + 2:] = torch.tensor([1, 4])
    return ref, other, tokens_ref, tokens_other, P


def test_agreement_explains_a_divergence_at_a_near_tie():
    r = gen.agreement(*synthetic())
    assert r["tokens_agreeing"] == [4, 2] and r["sequences_agreeing"] == 1 and r["logit_scale"] == 4.0
    assert r["rel_logit_diff_per_step"] == pytest.approx([0, 0, 0.005, 0], abs=1e-6)
    assert r["max_rel_logit_diff"] == pytest.approx(0.005, abs=1e-6)
    (d,) = r["first_divergences"]
    assert (d["sequence"], d["step"], d["near_tie"]) == (1, 2, True)
    assert d["top2_margin"] == pytest.approx(0.01, abs=1e-5) and d["logit_diff"] == pytest.approx(0.02, abs=1e-5)
    assert d["relative_margin"] == pytest.approx(0.0025, abs=1e-5)


def test_agreement_flags_a_divergence_with_a_large_margin():
    ref, other, tokens_ref, tokens_other, P = synthetic()
    tokens_other[0, P + 1] = 3                               # the logits agree, the tokens do not: a bug
    r = gen.agreement(ref, other, tokens_ref, tokens_other, P)
    assert r["tokens_agreeing"] == [1, 2] and r["sequences_agreeing"] == 0
    first = r["first_divergences"][0]
    assert (first["sequence"], first["step"], first["top2_margin"], first["near_tie"]) == (0, 1, 3.0, False)


# ---------------------------------------------------------------------------------------------- checks
def test_bad_arguments_are_refused_by_name(monkeypatch):
    model = tiny_model()
    prompt = gen.random_prompt(50, 1, 8)
    with pytest.raises(ValueError, match="'nope'"):
        gen.generate(model, prompt, 4, "nope")
    with pytest.raises(ValueError, match="block_size"):
        gen.generate(model, prompt, 25, "sdpa")              # 8 + 25 > 32
    with pytest.raises(ValueError, match="block_size"):
        gen.teacher_forced_logits(model, gen.random_prompt(50, 1, 33), 8, "sdpa")
    with pytest.raises(ValueError, match="n_new"):
        gen.generate(model, prompt, 0, "sdpa")
    with pytest.raises(ValueError, match="head_dim"):
        gen.demo_config(80)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)           # its import raises ImportError
    with pytest.raises(ValueError, match="fa4: flash_attn.cute"):
        gen.generate(model, prompt, 4, "fa4")
    cache = gen.KVCache(model, 1, 16)
    gen.forward_cached(model, prompt, cache, gen.attention_for("sdpa"))
    with pytest.raises(ValueError, match="one token"):
        gen.forward_cached(model, prompt[:, :2], cache, gen.attention_for("sdpa"))


def test_the_demo_config_fits_the_prompt_and_the_new_tokens():
    cfg = gen.demo_config()
    assert (cfg.head_dim, cfg.n_embd) == (128, 2048) and cfg.block_size >= 64 + 512
    assert gen.demo_config(64).head_dim == 64


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only refusal")
def test_timing_and_the_command_line_need_cuda(capsys):
    with pytest.raises(ValueError, match="CUDA"):
        gen.tokens_per_second(tiny_model(), 1, 4, 4, "sdpa")
    assert gen.main(["--out", "unused.json"]) == 2
    assert "CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(gen.KIND not in results.KINDS,
                    reason=f"flashattn.measure.results.KINDS has no {gen.KIND!r} yet (add it there)")
def test_the_record_kind_is_known(tmp_path):
    doc = results.write(tmp_path / "g.json", gen.KIND, [{"attention": "sdpa", "batch": 1}], meta={})
    assert results.read(tmp_path / "g.json", gen.KIND) == doc


# ------------------------------------------------------------------------------------------------- gpu
def gpu_model(head_dim):
    cfg = Config(vocab_size=512, block_size=128, n_layer=2, n_head=4, head_dim=head_dim, seed=0)
    return build_model(cfg, "sdpa", "cuda").to(torch.bfloat16).eval()


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_flashattn_decoding_follows_sdpa_to_the_noise_of_bf16(head_dim):
    model = gpu_model(head_dim)
    prompt = gen.random_prompt(512, 4, 16, seed=4, device="cuda")
    r = gen.compare(model, prompt, 48, "flashattn")
    assert r["max_rel_logit_diff"] < 2e-2, r["rel_logit_diff_per_step"]
    assert all(d["near_tie"] for d in r["first_divergences"]), r["first_divergences"]


@pytest.mark.gpu
def test_fa4_decoding_follows_sdpa_where_it_imports():
    try:
        gen.fa4_varlen()
    except ValueError as err:
        pytest.skip(str(err))
    r = gen.compare(gpu_model(128), gen.random_prompt(512, 4, 16, device="cuda"), 32, "fa4")
    assert r["max_rel_logit_diff"] < 2e-2


@pytest.mark.gpu
def test_tokens_per_second_times_the_decode_loop():
    speed = gen.decode_speed(gpu_model(128), 2, 8, 16, ["flashattn", "sdpa"], repeats=2)
    for s in speed.values():
        assert len(s["times_ms"]) == 2 and s["tokens_per_s"] == pytest.approx(2 * 16 / (s["median_ms"] / 1e3))
        assert s["ms_per_step"] == pytest.approx(s["median_ms"] / 16)
