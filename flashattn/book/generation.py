"""The decoding demonstration: the training demo's GPT generating tokens with a KV cache, attention by name.

    python -m flashattn.book.generation --out results/h200/generation.json

flashattn.book.training_model's GPT, walked block by block so that each layer keeps its keys and values
in a preallocated cache (B, max_len, H, D). The attentions share every line but the attention call:

* ``flashattn``: the prompt through ``flashattn.attention(causal=True)`` (on [B, H, T, D] views), each new
  token through ``flashattn.attention_with_kvcache`` (q (B, 1, H, D); it writes k, v into the cache);
* ``sdpa``: k, v written by slicing, then scaled_dot_product_attention against a transposed view of the
  cache's first L + 1 positions (is_causal for the prompt only: one new row sees every key);
* ``fa4``: FlashAttention-4's ``flash_attn_varlen_func`` with ``seqused_k`` over the cache written by slicing.

The weights are untrained (`build_model`'s seeded random draw): the logits are near-flat noise, so greedy
text is meaningless and greedy agreement between two attentions is decided by near-ties, where bf16
rounding flips the argmax. The honest check is therefore teacher forcing: both attentions on the same
tokens, logits compared step by step (`teacher_forced_logits`, `agreement`).

Precision: the model is cast to bf16 once (`.to(torch.bfloat16)`), not run under autocast: inference keeps
bf16 weights, the cache is bf16 anyway (the decode kernel reads bf16), and autocast adds a cast decision
per op to a loop whose batch-1 cost is mostly per-op overhead. The CPU tests run the same code in float32.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import flashattn
from flashattn.book.training_model import GPT, Config, build_model
from flashattn.measure import peers, results

ATTENTIONS = ("flashattn", "sdpa", "fa4")
KIND = "generation"                     # the record's kind in flashattn.measure.results


def demo_config(head_dim: int = 128) -> Config:
    """The decoding demo's model: larger than the training demo's so that a 64-token prompt plus 512 new
    tokens fits the position table; D=128 is the decode kernel's target, 64 is accepted too."""
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim must be 64 or 128; got {head_dim}")
    return Config(vocab_size=8192, block_size=1024, n_layer=8, n_head=16, head_dim=head_dim, seed=0)


def random_prompt(vocab_size: int, batch: int, prompt_len: int, seed: int = 0, device="cpu") -> torch.Tensor:
    """(batch, prompt_len) token ids from a seeded CPU generator: the same prompt on every device."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(vocab_size, (batch, prompt_len), generator=gen).to(device)


class KVCache:
    """Per layer keys and values (B, max_len, H, D) in the model's dtype, and how many positions hold tokens."""

    def __init__(self, model: GPT, batch: int, max_len: int):
        w, cfg = model.tok.weight, model.cfg
        shape = (batch, max_len, cfg.n_head, cfg.head_dim)
        self.k = [torch.empty(shape, dtype=w.dtype, device=w.device) for _ in model.blocks]
        self.v = [torch.empty(shape, dtype=w.dtype, device=w.device) for _ in model.blocks]
        self.length, self.max_len = 0, max_len
        # row n is n for every sequence: FA4's seqused_k as a view, with no launch per step
        self.lengths = torch.arange(max_len + 1, dtype=torch.int32, device=w.device)[:, None].repeat(1, batch)

    def write(self, layer: int, k, v):
        """Put k, v (B, T, H, D) at positions length .. length + T - 1 (by slicing); the caches back."""
        L, T = self.length, k.shape[1]
        self.k[layer][:, L:L + T] = k
        self.v[layer][:, L:L + T] = v
        return self.k[layer], self.v[layer]


# ------------------------------------------------------------------------- the attentions, (B, T, H, D)
def _attend_sdpa(q, k, v, cache: KVCache, layer: int):
    k_cache, v_cache = cache.write(layer, k, v)
    n = cache.length + q.shape[1]
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k_cache[:, :n].transpose(1, 2),
                                       v_cache[:, :n].transpose(1, 2), is_causal=q.shape[1] > 1)
    return y.transpose(1, 2)


def _attend_flashattn(attention, with_kvcache, q, k, v, cache: KVCache, layer: int):
    if cache.length == 0:                                     # the prompt: causal attention over itself
        cache.write(layer, k, v)
        return attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True).transpose(1, 2)
    return with_kvcache(q, cache.k[layer], cache.v[layer], k=k, v=v, cache_seqlens=cache.length, causal=True)


def _attend_fa4(varlen, q, k, v, cache: KVCache, layer: int):
    k_cache, v_cache = cache.write(layer, k, v)
    # one split: FlashAttention-4 (4.0.0b36) has no split-KV on SM 9.0 and asserts when its heuristic picks one
    out = varlen(q, k_cache, v_cache, seqused_k=cache.lengths[cache.length + q.shape[1]], causal=True, num_splits=1)
    return out[0] if isinstance(out, tuple) else out          # some versions return (out, lse)


def fa4_varlen():
    """FlashAttention-4's flash_attn_varlen_func; ValueError saying why when flash_attn.cute does not import."""
    return peers.fa4_module().flash_attn_varlen_func


def attention_for(name: str):
    """The attend function (q, k, v, cache, layer) -> y of attention `name`, its functions looked up now, at
    call time (so that a stand-in can replace them, and FlashAttention-4 is imported only when asked for)."""
    if name == "sdpa":
        return _attend_sdpa
    if name == "fa4":
        return functools.partial(_attend_fa4, fa4_varlen())
    if name == "flashattn":
        return functools.partial(_attend_flashattn, flashattn.attention, flashattn.attention_with_kvcache)
    raise ValueError(f"attn must be one of {', '.join(ATTENTIONS)}; got {name!r}")


def _check_length(model: GPT, prompt_len: int, n_new: int) -> None:
    if prompt_len < 1 or n_new < 1:
        raise ValueError(f"prompt length and n_new must be >= 1; got {prompt_len} and {n_new}")
    if prompt_len + n_new > model.cfg.block_size:
        raise ValueError(f"prompt ({prompt_len}) + n_new ({n_new}) exceeds the model's block_size "
                         f"({model.cfg.block_size}), the length of its position table")


# ------------------------------------------------------------------------------------------ the model
def forward_cached(model: GPT, idx, cache: KVCache, attend) -> torch.Tensor:
    """The logits (B, V) after tokens idx (B, T) at positions cache.length ..: the whole prompt into an
    empty cache, or one token after it. The same math as GPT.forward, one block at a time."""
    B, T = idx.shape
    L = cache.length
    if L + T > cache.max_len or (L > 0 and T != 1):
        raise ValueError(f"forward_cached takes a prompt into an empty cache or one token; got {T} at {L}")
    H, D = model.cfg.n_head, model.cfg.head_dim
    x = model.tok(idx) + model.pos.weight[L:L + T]
    for layer, block in enumerate(model.blocks):
        q, k, v = block.attn.qkv(block.ln1(x)).view(B, T, 3, H, D).unbind(2)     # (B, T, H, D) views
        x = x + block.attn.proj(attend(q, k, v, cache, layer).reshape(B, T, H * D))
        x = x + block.mlp(block.ln2(x))
    cache.length = L + T
    return model.head(model.ln_f(x[:, -1]))


@torch.no_grad()
def generate(model: GPT, prompt_ids, n_new: int, attn: str = "sdpa"):
    """Greedy decoding: (tokens (B, P + n_new), logits (B, n_new, V) float32), logits[:, i] the ones that
    chose tokens[:, P + i]. The model's dtype is the run's precision (cast it to bf16 on the GPU)."""
    attend = attention_for(attn)
    B, P = prompt_ids.shape
    _check_length(model, P, n_new)
    cache = KVCache(model, B, P + n_new)
    logits = [forward_cached(model, prompt_ids, cache, attend)]
    tokens = [prompt_ids, logits[-1].argmax(-1, keepdim=True)]
    for _ in range(n_new - 1):
        logits.append(forward_cached(model, tokens[-1], cache, attend))
        tokens.append(logits[-1].argmax(-1, keepdim=True))
    return torch.cat(tokens, 1), torch.stack(logits, 1).float()


@torch.no_grad()
def teacher_forced_logits(model: GPT, tokens, prompt_len: int, attn: str = "sdpa") -> torch.Tensor:
    """The decode path over GIVEN tokens (B, T), nothing sampled: logits (B, T - prompt_len, V) float32,
    [:, i] predicting tokens[:, prompt_len + i]. Two attentions on one sequence see the same inputs."""
    attend = attention_for(attn)
    B, T = tokens.shape
    _check_length(model, prompt_len, T - prompt_len)
    cache = KVCache(model, B, T)
    logits = [forward_cached(model, tokens[:, :prompt_len], cache, attend)]
    logits += [forward_cached(model, tokens[:, t:t + 1], cache, attend) for t in range(prompt_len, T - 1)]
    return torch.stack(logits, 1).float()


def agreement(logits_ref, logits_other, tokens_ref, tokens_other, prompt_len: int) -> dict:
    """How two attentions agree. logits_ref: the reference's own greedy run (B, n, V); logits_other: the other
    attention teacher-forced on the reference's tokens (same inputs); tokens_*: each one's own greedy run.

    Reports max |Δlogit| per step over the step's max |logit| (the scale), the leading greedy tokens each
    sequence agrees on, and at each first divergence the reference's top-2 margin. On identical inputs a
    flip needs margin <= 2 |Δlogit| (near_tie); the size of |Δlogit| against the scale is what judges a bug."""
    diff = (logits_other - logits_ref).abs()
    scale = logits_ref.abs().amax(dim=(0, 2)).clamp_min(1e-30)
    rel = diff.amax(dim=(0, 2)) / scale
    n = logits_ref.shape[1]
    same = tokens_ref[:, prompt_len:prompt_len + n] == tokens_other[:, prompt_len:prompt_len + n]
    agreeing = same.int().cumprod(1).sum(1).tolist()
    divergences = []
    for b, step in enumerate(agreeing):
        if step < n:
            top2 = logits_ref[b, step].topk(2).values
            margin, d = float(top2[0] - top2[1]), float(diff[b, step].max())
            divergences.append(dict(sequence=b, step=step, top2_margin=margin, logit_diff=d,
                                    relative_margin=margin / float(scale[step]), near_tie=margin <= 2 * d))
    return dict(steps=n, max_rel_logit_diff=float(rel.max()), rel_logit_diff_per_step=rel.tolist(),
                logit_scale=float(scale.max()), tokens_agreeing=agreeing, sequences_agreeing=agreeing.count(n),
                first_divergences=divergences)


def compare(model: GPT, prompt_ids, n_new: int, attn: str, reference: str = "sdpa") -> dict:
    """`agreement` of attention `attn` with `reference` on one prompt."""
    tokens_ref, logits_ref = generate(model, prompt_ids, n_new, reference)
    tokens_other, _ = generate(model, prompt_ids, n_new, attn)
    logits_other = teacher_forced_logits(model, tokens_ref, prompt_ids.shape[1], attn)
    return agreement(logits_ref, logits_other, tokens_ref, tokens_other, prompt_ids.shape[1])


# ----------------------------------------------------------------------------------------------- speed
@torch.no_grad()
def decode_speed(model: GPT, batch: int, prompt_len: int, n_new: int, attns, repeats: int = 5,
                 warmup: int = 1, seed: int = 0) -> dict:
    """{attn: {tokens_per_s, ms_per_step, ...}}: n_new greedy decode steps after a prefill (untimed, synced),
    between CUDA events, the attentions' repeats interleaved (A, B, A, B, ...), median over repeats. The loop
    runs as Python launches it, so at batch 1 launch overhead dominates and the attention's share is small."""
    if model.tok.weight.device.type != "cuda":
        raise ValueError("decode_speed times with CUDA events: put the model on a CUDA device")
    _check_length(model, prompt_len, n_new)
    attends = {a: attention_for(a) for a in attns}
    prompt = random_prompt(model.cfg.vocab_size, batch, prompt_len, seed, model.tok.weight.device)

    def once(attend) -> float:
        cache = KVCache(model, batch, prompt_len + n_new)
        logits = forward_cached(model, prompt, cache, attend)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(n_new):
            logits = forward_cached(model, logits.argmax(-1, keepdim=True), cache, attend)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    times = {a: [] for a in attns}
    for r in range(warmup + repeats):
        for a in attns:
            ms = once(attends[a])
            times[a] += [ms] if r >= warmup else []
    med = {a: statistics.median(ms) for a, ms in times.items()}
    return {a: dict(tokens_per_s=batch * n_new / (med[a] / 1e3), ms_per_step=med[a] / n_new, median_ms=med[a],
                    times_ms=times[a]) for a in attns}


def tokens_per_second(model: GPT, batch: int, prompt_len: int, n_new: int, attn: str, repeats: int = 5) -> dict:
    """`decode_speed` of one attention."""
    return decode_speed(model, batch, prompt_len, n_new, [attn], repeats)[attn]


# ------------------------------------------------------------------------------------------------- cli
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashattn.book.generation", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=results.H200 / "generation.json", help="(default: %(default)s)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="(default: %(default)s)")
    for name, default in (("prompt-len", 64), ("new-tokens", 512), ("repeats", 5), ("head-dim", 128)):
        p.add_argument("--" + name, type=int, default=default, help="(default: %(default)s)")
    args = p.parse_args(argv)
    if args.head_dim not in (64, 128):
        p.error("--head-dim must be 64 or 128")
    if not torch.cuda.is_available():
        print(f"{p.prog}: needs a CUDA GPU (flashattn's kernels and the CUDA-event timing)", file=sys.stderr)
        return 2
    results.schema(KIND)               # an unknown kind fails here, not after minutes of measuring
    cfg = demo_config(args.head_dim)
    model = build_model(cfg, "sdpa", "cuda").to(torch.bfloat16).eval()
    attns, skipped = ["flashattn", "sdpa"], {}
    try:
        fa4_varlen()
        generate(model, random_prompt(cfg.vocab_size, 1, 8, device="cuda"), 2, "fa4")   # runs here at all?
        attns.append("fa4")
    except (ValueError, RuntimeError, AssertionError) as err:
        skipped["fa4"] = f"{type(err).__name__}: {err}"
    rows = []
    for batch in args.batch:
        speed = decode_speed(model, batch, args.prompt_len, args.new_tokens, attns, args.repeats)
        prompt = random_prompt(cfg.vocab_size, batch, args.prompt_len, device="cuda")
        for a in attns:
            vs = None if a == "sdpa" else compare(model, prompt, args.new_tokens, a)
            rows.append(dict(attention=a, batch=batch, status="ok", **speed[a], vs_sdpa=vs))
            s, note = speed[a], f"max rel Δlogit {vs['max_rel_logit_diff']:.1e}" if vs else ""
            print(f"batch {batch:3d} {a:10s} {s['tokens_per_s']:9.0f} tokens/s {s['ms_per_step']:.3f} ms/step", note)
    rows += [dict(attention=a, status="skipped", reason=why) for a, why in skipped.items()]
    meta = dict(results.environment(argv, prog=p.prog), model=dict(vars(cfg), n_embd=cfg.n_embd), skipped=skipped)
    settings = dict(prompt_len=args.prompt_len, new_tokens=args.new_tokens, repeats=args.repeats, warmup=1,
                    dtype="bfloat16", timing="decode loop only, CUDA events, attentions interleaved, median")
    results.write(args.out, KIND, rows, meta, settings)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
