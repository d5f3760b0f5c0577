"""Exact per-token divergences between two next-token distributions, from fp32 logits.

P is the checkpoint, Q the reference. For each row (one position) and the
token that was actually written there, ``token_metrics`` returns, in float32 and in nats:

  logp_ckpt, logp_ref      log P(token), log Q(token)
  rank_ckpt, rank_ref      1 + number of vocabulary entries with a strictly larger logit
  entropy_ckpt, entropy_ref
  kl_ckpt_ref              KL(P||Q) = sum_v p (lp - lq)          (forward)
  kl_ref_ckpt              KL(Q||P) = sum_v q (lq - lp)          (reverse)
  js                       0.5 KL(P||M) + 0.5 KL(Q||M), M = (P+Q)/2
  k1, k2, k3               Schulman's sampled-token estimators of KL(Q||P): the forced
                           tokens were sampled from Q; with log r = logp_ckpt - logp_ref,
                           k1 = -log r, k2 = (log r)^2 / 2, k3 = expm1(log r) - log r
  topk_ids_*, topk_p_*     the k most likely tokens under each model and their probabilities

How it stays exact without an epsilon:
- log-probabilities are ``logits - logsumexp`` in fp32; probabilities are their exp, so a
  probability that underflows to 0 multiplies a finite log-ratio and contributes 0.
- d = lp - lq is formed per entry from the max-shifted logits, so KL is a sum of
  per-entry terms, never a difference of two entropy-sized numbers (which would lose ~1e-4
  relative at vocab 128k). Identical inputs give d == 0 exactly, hence KL == JS == 0
  exactly; swapping P and Q negates d exactly. Log-sums, the forced token's log-probs and
  log-ratio (k1..k3) are float64 row scalars rounded once; the vocabulary sums accumulate
  in float64 (cheap: the accumulator only), the per-entry terms are fp32.
- Precision: ~1e-7 relative per entry, so a divergence is exact to about
  1e-7 x sum_v p|d| nats absolute: 1e-5 relative for values above ~0.03 nats and a few
  1e-7 nats absolute below (the prior project's bf16 path was off by ~1e-2).
- k3 = expm1(log r) - log r is +inf when log r > ~88.7 (r overflows float32); that is the
  value, not an error, and the only metric allowed to be infinite.
- JS uses log m = logaddexp(lp, lq) - ln 2 in the rearranged form
  lp - log m = ln 2 - softplus(-d) = -log1p(expm1(-d) / 2); the log1p form is used for
  d > -1 (no cancellation near d = 0, exactly 0 at d = 0), the softplus form below (no
  overflow of expm1 for very negative d).
- Rounding can leave a KL a few ulps below 0 or a JS a few ulps above ln 2 (e.g. for
  nearly identical distributions). Such values are clamped to the valid range
  ([0, inf) and [0, ln 2]); ``clamp=False`` returns the raw sums (the tests check that the
  clamp only ever moves values by rounding-level amounts).

Memory: the caller passes one chunk of positions; the function holds a handful of
[chunk, V] fp32 temporaries (p, q, lp, lq, d and the JS terms). ``compiled_row_fn`` gives
the engine a faster equivalent: on CUDA the hand-written Triton kernel of fused_metrics
(three reads of each logit row, a few scalars written per row), on CPU (and on CUDA
without Triton) this function through torch.compile. Top-k uses a block-maximum
prefilter so it reads each logit row once instead of running a full-vocabulary radix
select (the Triton kernel computes the block maxima in its first pass).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

LN2 = math.log(2.0)

# Row-level float metrics, in the order of schemas.TOKENS.
FLOAT_METRICS = (
    "logp_ckpt", "logp_ref", "entropy_ckpt", "entropy_ref",
    "kl_ckpt_ref", "kl_ref_ckpt", "js", "k1", "k2", "k3",
)
INT_METRICS = ("rank_ckpt", "rank_ref")
TOPK_METRICS = ("topk_ids_ckpt", "topk_p_ckpt", "topk_ids_ref", "topk_p_ref")

_TOPK_BLOCK = 128


def _log_half_ratio(d: torch.Tensor) -> torch.Tensor:
    """log(2p / (p+q)) as a function of d = log p - log q, accurate for every d."""
    near = -torch.log1p(torch.expm1(-d) * 0.5)
    far = LN2 - F.softplus(-d)
    return torch.where(d > -1.0, near, far)


def _weighted(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """w * x with 0 where w == 0 (so 0 * inf and 0 * NaN count as 0)."""
    return torch.where(w > 0, w * x, torch.zeros_like(x))


def _row_metrics(logits_p: torch.Tensor, logits_q: torch.Tensor, token_ids: torch.Tensor,
                 clamp: bool = True) -> tuple[torch.Tensor, ...]:
    """The reductions over the vocabulary; pure tensor code so torch.compile can fuse it."""
    idx = token_ids.view(-1, 1)
    # logsumexp kept as (max, log of the shifted sum), exp and sum in float64: a
    # fp32 max + log(sum) would round to ulp(|lse|) ~ 1e-6 and shift every d of the row,
    # and log-ratios of the forced token near 0 (k1..k3) would lose their digits.
    max_p = logits_p.amax(-1, keepdim=True)
    max_q = logits_q.amax(-1, keepdim=True)
    z_p = logits_p - max_p
    z_q = logits_q - max_q
    logsum_p = z_p.double().exp().sum(-1, keepdim=True).log()
    logsum_q = z_q.double().exp().sum(-1, keepdim=True).log()
    lp = z_p - logsum_p.float()
    lq = z_q - logsum_q.float()
    p = lp.exp()
    q = lq.exp()
    # d = lp - lq from the max-shifted logits and the float64 difference of the log-sums:
    # exact at the top entries of peaked rows (z = 0), exactly 0 for identical rows and
    # exactly -d when P and Q are swapped.
    d = (z_p - z_q) - (logsum_p - logsum_q).float()
    tok_p = logits_p.gather(1, idx)
    tok_q = logits_q.gather(1, idx)
    rank_p = (logits_p > tok_p).sum(-1) + 1
    rank_q = (logits_q > tok_q).sum(-1) + 1
    f64 = torch.float64  # accumulate in float64: the products are fp32, the sums exact-ish
    # An entry with zero probability contributes nothing to a sum weighted by that
    # probability, even where its log is -inf (a logit masked to -inf in one model, or in
    # both, where d itself is -inf - -inf = NaN): 0 * log 0 = 0, exactly.
    kl_pq64 = _weighted(p, d).sum(-1, dtype=f64)
    kl_qp64 = -_weighted(q, d).sum(-1, dtype=f64)
    ent_p64 = -_weighted(p, lp).sum(-1, dtype=f64)
    ent_q64 = -_weighted(q, lq).sum(-1, dtype=f64)
    # Per entry p f(d) + q f(-d) >= 0. (The identity f(-d) = f(d) - d would save one f but
    # cancels against KL(Q||P) when that is large: 3e-5 error at KL ~ 200.)
    js64 = 0.5 * (_weighted(p, _log_half_ratio(d))
                  + _weighted(q, _log_half_ratio(-d))).sum(-1, dtype=f64)
    return finish_rows(max_p.squeeze(-1), max_q.squeeze(-1), logsum_p.squeeze(-1),
                       logsum_q.squeeze(-1), tok_p.squeeze(-1), tok_q.squeeze(-1),
                       kl_pq64, kl_qp64, ent_p64, ent_q64, js64, rank_p, rank_q, clamp)


def finish_rows(max_p, max_q, logsum_p, logsum_q, tok_p, tok_q, kl_pq64, kl_qp64, ent_p64,
                ent_q64, js64, rank_p, rank_q, clamp: bool = True) -> tuple[torch.Tensor, ...]:
    """Row scalars from the vocabulary reductions (all [n]: fp32 row max and written-token
    logit, float64 log of the shifted sum of exp and float64 sums), shared by the torch and
    the fused Triton reductions."""
    kl_pq, kl_qp, js = kl_pq64.float(), kl_qp64.float(), js64.float()
    if clamp:
        kl_pq = kl_pq.clamp_min(0.0)
        kl_qp = kl_qp.clamp_min(0.0)
        js = js.clamp(0.0, LN2)
    # Row scalars in float64, then rounded once: exact to ~6e-8 relative.
    shift64 = (max_p.double() - max_q.double()) + (logsum_p - logsum_q)
    logp_p = ((tok_p.double() - max_p.double()) - logsum_p).float()
    logp_q = ((tok_q.double() - max_q.double()) - logsum_q).float()
    log_r = (tok_p.double() - tok_q.double()) - shift64
    k1 = (-log_r).float()
    k2 = (0.5 * log_r * log_r).float()
    k3 = (torch.expm1(log_r) - log_r).float()
    return (logp_p, logp_q, ent_p64.float(), ent_q64.float(), kl_pq, kl_qp, js, rank_p, rank_q,
            k1, k2, k3, max_p + logsum_p.float(), max_q + logsum_q.float())


def fused_row_fn(logits_p: torch.Tensor, logits_q: torch.Tensor, token_ids: torch.Tensor,
                 clamp: bool = True, block: int | None = None) -> tuple[torch.Tensor, ...]:
    """``_row_metrics`` with the vocabulary reductions in one Triton kernel (CUDA; the
    tests run it in Triton's CPU interpreter)."""
    from rlprobe_nb.forcing import fused_metrics
    r = fused_metrics.row_reductions(logits_p, logits_q, token_ids,
                                     block=block or fused_metrics.BLOCK)
    idx = token_ids.view(-1, 1)
    tok_p = logits_p.gather(1, idx).squeeze(-1)
    tok_q = logits_q.gather(1, idx).squeeze(-1)
    s = r["sums"].unbind(1)
    rows = finish_rows(r["max_p"], r["max_q"], r["logsum_p"], r["logsum_q"], tok_p, tok_q,
                       *s, r["ranks"][:, 0], r["ranks"][:, 1], clamp)
    if "block_max_p" in r:  # top-k's prefilter, computed in the kernel's first pass
        rows = rows + (r["block_max_p"], r["block_max_q"])
    return rows


def topk_logits(logits: torch.Tensor, k: int,
                block_maxima: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k (values, ids) of each row, sorted descending.

    The k largest entries of a row lie in the k blocks with the largest block maxima (a
    block holding a top-k entry has a top-k entry as its maximum), so one pass of block
    maxima plus a top-k over k*B candidates gives the exact answer at vocabulary scale.
    ``block_maxima`` ([n, ceil(V / 128)]) may come precomputed (the fused kernel's pass 1).
    """
    n, v = logits.shape
    k = min(k, v)
    block = _TOPK_BLOCK
    if v <= 4 * block * max(k, 1):
        return torch.topk(logits, k, dim=-1)
    full = v // block
    if block_maxima is not None:
        maxima = block_maxima
    else:
        maxima = logits[:, : full * block].view(n, full, block).amax(-1)
        if full * block < v:
            maxima = torch.cat([maxima, logits[:, full * block:].amax(-1, keepdim=True)], dim=1)
    top_blocks = torch.topk(maxima, k, dim=-1).indices  # [n, k]
    cand = (top_blocks.unsqueeze(-1) * block
            + torch.arange(block, device=logits.device)).view(n, k * block)
    valid = cand < v
    cand_vals = logits.gather(1, cand.clamp_max(v - 1))
    cand_vals = cand_vals.masked_fill(~valid, float("-inf"))
    vals, pos = torch.topk(cand_vals, k, dim=-1)
    return vals, cand.gather(1, pos)


def token_metrics(logits_p: torch.Tensor, logits_q: torch.Tensor, token_ids: torch.Tensor,
                  topk: int = 5, clamp: bool = True, row_fn=None) -> dict[str, torch.Tensor]:
    """Per-row metrics of checkpoint P vs reference Q for one chunk of positions.

    logits_p, logits_q: [n, V] float32 (finite); token_ids: [n] integer, the token written
    at each row. Returns a dict keyed by schemas.TOKENS column names: [n] float32 tensors,
    [n] int32 ranks and [n, topk] top-k ids (int32) / probabilities (float32), on the
    input's device. ``row_fn`` lets the engine pass a faster version of the reductions
    (``compiled_row_fn``): it returns ``_row_metrics``'s 14 values, optionally followed by
    the two [n, ceil(V / 128)] block maxima that top-k's prefilter needs.
    """
    if logits_p.dtype != torch.float32 or logits_q.dtype != torch.float32:
        raise TypeError(f"token_metrics needs float32 logits, got {logits_p.dtype} and "
                        f"{logits_q.dtype}: compute the LM head with fp32 output")
    if logits_p.shape != logits_q.shape or logits_p.dim() != 2:
        raise ValueError(f"logits shapes differ or are not 2-D: {tuple(logits_p.shape)} vs "
                         f"{tuple(logits_q.shape)}")
    if token_ids.shape != logits_p.shape[:1]:
        raise ValueError(f"token_ids shape {tuple(token_ids.shape)} != ({logits_p.shape[0]},)")
    fn = row_fn or _row_metrics
    res = fn(logits_p, logits_q, token_ids.long(), clamp)
    (logp_p, logp_q, ent_p, ent_q, kl_pq, kl_qp, js, rank_p, rank_q, k1, k2, k3,
     lse_p, lse_q) = res[:14]
    block_maxima = res[14:16] if len(res) > 14 else (None, None)
    out = {
        "logp_ckpt": logp_p, "logp_ref": logp_q,
        "entropy_ckpt": ent_p, "entropy_ref": ent_q,
        "kl_ckpt_ref": kl_pq, "kl_ref_ckpt": kl_qp, "js": js,
        "k1": k1, "k2": k2, "k3": k3,
        "rank_ckpt": rank_p.to(torch.int32), "rank_ref": rank_q.to(torch.int32),
    }
    if topk > 0:
        for side, logits, lse, maxima in (("ckpt", logits_p, lse_p, block_maxima[0]),
                                          ("ref", logits_q, lse_q, block_maxima[1])):
            vals, ids = topk_logits(logits, topk, maxima)
            out[f"topk_ids_{side}"] = ids.to(torch.int32)
            out[f"topk_p_{side}"] = (vals - lse.unsqueeze(-1)).exp()
    return out


_COMPILED = {}


def compiled_row_fn(device: torch.device | str):
    """The fastest available reductions for a device: on CUDA the hand-fused Triton kernel
    (fused_metrics) after a self-check against the torch math, else torch.compile'd
    reductions (Triton on CUDA, C++ on CPU); ``row_fn_kind`` names which one.

    On CPU at vocab 49k eager math takes ~10 ms a position and compiled ~0.5 ms, after a
    one-time compile of ~30 s (cached on disk by inductor for later processes).
    Compilation failures fall back to eager with a warning: same numbers, only slower.
    """
    dev = torch.device(device)
    if dev.type not in ("cuda", "cpu"):
        return None
    if dev.type == "cuda" and _fused_ok(dev):
        return fused_row_fn
    return torch_compiled_row_fn(dev)


def torch_compiled_row_fn(device: torch.device | str):
    """``_row_metrics`` through torch.compile (None where it cannot be compiled)."""
    dev = torch.device(device)
    if dev.type not in ("cuda", "cpu"):
        return None
    key = dev.type
    if key not in _COMPILED:
        try:
            # dynamic from the first call: a run's chunks have two sizes (full, and the
            # last of each batch), and a second, specialised trace costs ~2 s a process
            compiled = torch.compile(_row_metrics, dynamic=True)
        except Exception as err:  # noqa: BLE001 - any compiler problem means "use eager"
            warnings.warn(f"torch.compile unavailable ({err!r}); divergence math runs eager")
            compiled = None
        _COMPILED[key] = compiled
    fn = _COMPILED[key]
    if fn is None:
        return None

    def guarded(*args):
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001
            warnings.warn(f"compiled divergence math failed ({err!r}); falling back to eager")
            _COMPILED[key] = None
            return _row_metrics(*args)

    return guarded


_FUSED_OK: dict[str, bool] = {}


def _fused_ok(device: torch.device) -> bool:
    """Triton importable and the fused kernel agrees with the torch math on this device."""
    key = str(device)
    if key not in _FUSED_OK:
        try:
            g = torch.Generator(device=device).manual_seed(0)
            a = torch.randn(8, 5003, generator=g, device=device) * 4
            b = a + torch.randn(8, 5003, generator=g, device=device)
            t = torch.randint(0, 5003, (8,), generator=g, device=device)
            want = token_metrics(a, b, t, topk=5)
            got = token_metrics(a, b, t, topk=5, row_fn=fused_row_fn)
            bad = [k for k in want if not torch.allclose(want[k].double(), got[k].double(),
                                                         rtol=1e-5, atol=1e-6)]
            if bad:
                raise AssertionError(f"{bad} differ from the torch math")
            _FUSED_OK[key] = True
        except Exception as err:  # noqa: BLE001 - no triton, compile error or a mismatch
            warnings.warn(f"fused Triton metrics unavailable on {device} ({err!r}); "
                          "using torch.compile'd math (same numbers, slower)")
            _FUSED_OK[key] = False
    return _FUSED_OK[key]


def row_fn_kind(fn) -> str:
    """What a row function is, for manifests: 'triton-fused', 'torch.compile' or 'eager'."""
    if fn is None:
        return "eager"
    return "triton-fused" if fn is fused_row_fn else "torch.compile"


def reference_metrics_f64(logp_p: torch.Tensor, logp_q: torch.Tensor, token_ids: torch.Tensor,
                          logits_p: torch.Tensor | None = None,
                          logits_q: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Textbook float64 formulas from float64 log-probabilities, for tests and benchmarks.

    Deliberately written differently from ``_row_metrics`` (entropy via m, JS as
    H(M) - (H(P)+H(Q))/2) so a shared mistake is unlikely. Ranks use the logits if given.
    """
    lp, lq = logp_p.double(), logp_q.double()
    p, q = lp.exp(), lq.exp()
    m = 0.5 * (p + q)
    lm = torch.log(m)
    ent = lambda pr, lpr: -(torch.where(pr > 0, pr * lpr, torch.zeros_like(pr))).sum(-1)  # noqa: E731
    idx = token_ids.long().view(-1, 1)
    a = lp.gather(1, idx).squeeze(-1)
    b = lq.gather(1, idx).squeeze(-1)
    log_r = a - b
    rp = (logits_p if logits_p is not None else lp)
    rq = (logits_q if logits_q is not None else lq)
    return {
        "logp_ckpt": a, "logp_ref": b,
        "entropy_ckpt": ent(p, lp), "entropy_ref": ent(q, lq),
        "kl_ckpt_ref": (p * (lp - lq)).sum(-1), "kl_ref_ckpt": (q * (lq - lp)).sum(-1),
        "js": ent(m, lm) - 0.5 * (ent(p, lp) + ent(q, lq)),
        "k1": -log_r, "k2": 0.5 * log_r ** 2, "k3": torch.exp(log_r) - 1 - log_r,
        "rank_ckpt": (rp > rp.gather(1, idx)).sum(-1) + 1,
        "rank_ref": (rq > rq.gather(1, idx)).sum(-1) + 1,
    }


def relative_error(got: torch.Tensor, want: torch.Tensor, floor: float = 1e-6) -> torch.Tensor:
    """|got - want| / max(|want|, floor): relative error with an absolute floor for values
    that are exactly or nearly zero (a KL of 1e-9 has no meaningful 6th significant digit
    in fp32 arithmetic whose inputs are themselves rounded to ~1e-7 relative)."""
    got, want = got.double(), want.double()
    return (got - want).abs() / want.abs().clamp_min(floor)
