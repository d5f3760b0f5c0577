"""The vocabulary reductions of divergence.token_metrics as one Triton kernel (CUDA).

Why a hand-written kernel: at vocabulary 128k the metric math is a few passes over two
[chunk, V] float32 logit blocks, and the torch.compile'd version of it took ~3.8 ms per
1024 positions on an H200 (top-k included; 12 % of the engine's time for one more
checkpoint with compiled layers). This kernel reads each row of P and Q three times (max,
rank and top-k block maxima; sum of exp; the divergence sums), writes a few scalars per
row, and with top-k takes ~2.4 ms per 1024 positions (benchmarks/bench_engine.py, "part:
metric math"). It is bound by its transcendentals, not by memory.

It computes what ``divergence._row_metrics`` computes, term for term: the same max-shifted
logits z, the same d = (z_p - z_q) - fp32(logsum_p - logsum_q) (so identical inputs give 0
and swapping P and Q negates d exactly), fp32 per-entry terms accumulated in float64,
ranks from strict comparisons of the fp32 logits. Only the JS term per entry is formed
differently (``_js_term``: two transcendentals instead of eight, as accurate, still
exactly 0 at d = 0 and exactly symmetric). Transcendentals are libdevice's accurate ones
(not the approximate hardware exp/log that ``tl.exp`` lowers to). The row scalars
(log-probs of the written token, k1..k3, clamping) are finished by
``divergence.finish_rows`` in torch, shared with the torch path.

The kernel runs in Triton's CPU interpreter too (TRITON_INTERPRET=1 before import), which
is how the tests check it on a machine without a GPU. The interpreter has no libdevice, so
there the transcendentals are numpy's (through tl.exp/tl.log, exact to an ulp on CPU) with
log1p from Goldberg's accurate identity; the GPU build uses libdevice.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

BLOCK = 2048
NUM_WARPS = 8
TOPK_BLOCK = 128  # = divergence._TOPK_BLOCK
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _exp(x, CPU: tl.constexpr):
    if CPU:
        return tl.exp(x)
    else:
        return libdevice.exp(x)


@triton.jit
def _log(x, CPU: tl.constexpr):
    if CPU:
        return tl.log(x)
    else:
        return libdevice.log(x)


@triton.jit
def _log1p(x, CPU: tl.constexpr):
    if CPU:  # Goldberg: log(u) * x / (u - 1) cancels the rounding of u = 1 + x
        u = 1.0 + x
        return tl.where(u == 1.0, x, tl.log(u) * x / tl.where(u == 1.0, 1.0, u - 1.0))
    else:
        return libdevice.log1p(x)


@triton.jit
def _js_term(p, q, d, CPU: tl.constexpr):
    """p log(2p/(p+q)) + q log(2q/(p+q)) for one entry, d = log p - log q.

    |d| < 1: the two halves cancel to second order (the sum is ~ (p+q) d^2 / 8), so it is
    formed as (p+q) y j(y), y = d^2, where (p+q) j(d^2) d^2 is the term exactly
    (term / (p+q) is even in d) and j is a degree-6 polynomial fitted in float64 on
    [0, 1] (fit error 2e-11, ~4e-8 relative once evaluated in fp32). Symmetric in (p, q)
    bit for bit, so JS(P, Q) == JS(Q, P) exactly, and exactly 0 at d = 0.
    |d| >= 1: f(+-d) = ln 2 - log1p(e^-|d|) - max(-+d, 0), no cancellation there.
    One exp and one log1p per entry instead of eight transcendentals in the two-branch
    form of divergence._log_half_ratio applied to both sides.
    """
    x = tl.minimum(d * d, 1.0)
    j = 1.442422075115246e-07
    j = j * x - 1.9076617263635853e-06
    j = j * x + 1.9171335225109942e-05
    j = j * x - 0.00018444471061229706
    j = j * x + 0.001736108330078423
    j = j * x - 0.015625
    j = j * x + 0.125
    near = (p + q) * x * j
    s = 0.6931471805599453 - _log1p(_exp(-tl.abs(d), CPU), CPU)
    far = (tl.where(p > 0.0, p * (s - tl.maximum(-d, 0.0)), 0.0)
           + tl.where(q > 0.0, q * (s - tl.maximum(d, 0.0)), 0.0))
    return tl.where(tl.abs(d) < 1.0, near, far)


@triton.jit
def _maxima_and_ranks(p_row, q_row, row, tok_p, tok_q, V, BMAX_P, BMAX_Q, NBLK,
                      BLOCK: tl.constexpr, TOPK_BLOCK: tl.constexpr, NB: tl.constexpr,
                      WRITE_BMAX: tl.constexpr):
    """Pass 1: row maxima, ranks (1 + entries with a strictly larger logit) and the maxima
    of TOPK_BLOCK-wide blocks, top-k's prefilter (divergence.topk_logits)."""
    offs = tl.arange(0, BLOCK)
    mx_p = tl.full([BLOCK], float("-inf"), tl.float32)
    mx_q = tl.full([BLOCK], float("-inf"), tl.float32)
    above_p = tl.zeros([BLOCK], tl.int32)
    above_q = tl.zeros([BLOCK], tl.int32)
    for start in range(0, V, BLOCK):
        idx = start + offs
        inside = idx < V
        xp = tl.load(p_row + idx, mask=inside, other=float("-inf"))
        xq = tl.load(q_row + idx, mask=inside, other=float("-inf"))
        mx_p = tl.maximum(mx_p, xp)
        mx_q = tl.maximum(mx_q, xq)
        above_p += (xp > tok_p).to(tl.int32)
        above_q += (xq > tok_q).to(tl.int32)
        if WRITE_BMAX:
            bidx = start // TOPK_BLOCK + tl.arange(0, NB)
            keep = bidx < NBLK
            tl.store(BMAX_P + row * NBLK + bidx, tl.max(tl.reshape(xp, (NB, TOPK_BLOCK)), 1),
                     mask=keep)
            tl.store(BMAX_Q + row * NBLK + bidx, tl.max(tl.reshape(xq, (NB, TOPK_BLOCK)), 1),
                     mask=keep)
    return tl.max(mx_p, 0), tl.max(mx_q, 0), tl.sum(above_p, 0) + 1, tl.sum(above_q, 0) + 1


@triton.jit
def _log_sums(p_row, q_row, m_p, m_q, V, BLOCK: tl.constexpr, CPU: tl.constexpr):
    """Pass 2: log of the sum of exp(z) in float64, exp taken in float64 too: an fp32 exp
    would leave ~1e-7 in the log-sums, which is 1e-5 relative in k1..k3 when log r ~ 0.01."""
    offs = tl.arange(0, BLOCK)
    se_p = tl.zeros([BLOCK], tl.float64)
    se_q = tl.zeros([BLOCK], tl.float64)
    for start in range(0, V, BLOCK):
        idx = start + offs
        inside = idx < V
        xp = tl.load(p_row + idx, mask=inside, other=float("-inf"))
        xq = tl.load(q_row + idx, mask=inside, other=float("-inf"))
        se_p += _exp((xp - m_p).to(tl.float64), CPU)
        se_q += _exp((xq - m_q).to(tl.float64), CPU)
    return _log(tl.sum(se_p, 0), CPU), _log(tl.sum(se_q, 0), CPU)


@triton.jit
def _divergence_sums(p_row, q_row, m_p, m_q, ls_p64, ls_q64, V, BLOCK: tl.constexpr,
                     CPU: tl.constexpr):
    """Pass 3: KL(P||Q), KL(Q||P), H(P), H(Q) and JS, fp32 terms accumulated in float64."""
    offs = tl.arange(0, BLOCK)
    ls_p = ls_p64.to(tl.float32)
    ls_q = ls_q64.to(tl.float32)
    dls = (ls_p64 - ls_q64).to(tl.float32)
    kl_pq = tl.zeros([BLOCK], tl.float64)
    kl_qp = tl.zeros([BLOCK], tl.float64)
    en_p = tl.zeros([BLOCK], tl.float64)
    en_q = tl.zeros([BLOCK], tl.float64)
    js = tl.zeros([BLOCK], tl.float64)
    for start in range(0, V, BLOCK):
        idx = start + offs
        inside = idx < V
        xp = tl.load(p_row + idx, mask=inside, other=0.0)
        xq = tl.load(q_row + idx, mask=inside, other=0.0)
        zp = xp - m_p
        zq = xq - m_q
        lp = zp - ls_p
        lq = zq - ls_q
        p = tl.where(inside, _exp(lp, CPU), 0.0)
        q = tl.where(inside, _exp(lq, CPU), 0.0)
        d = (zp - zq) - dls
        # an entry with zero probability adds nothing, even where its log is -inf (a
        # masked logit) or d is NaN (masked in both): 0 * log 0 = 0, as in the torch math
        hp = p > 0.0
        hq = q > 0.0
        d = tl.where(hp | hq, d, 0.0)
        kl_pq += tl.where(hp, p * d, 0.0).to(tl.float64)
        kl_qp += tl.where(hq, q * d, 0.0).to(tl.float64)
        en_p += tl.where(hp, p * lp, 0.0).to(tl.float64)
        en_q += tl.where(hq, q * lq, 0.0).to(tl.float64)
        js += _js_term(p, q, d, CPU).to(tl.float64)
    return (tl.sum(kl_pq, 0), -tl.sum(kl_qp, 0), -tl.sum(en_p, 0), -tl.sum(en_q, 0),
            0.5 * tl.sum(js, 0))


@triton.jit
def _rows_kernel(P, Q, TOK, V, stride_p, stride_q,
                 MAX_P, MAX_Q, LOGSUM_P, LOGSUM_Q, SUMS, RANKS, BMAX_P, BMAX_Q, NBLK,
                 BLOCK: tl.constexpr, TOPK_BLOCK: tl.constexpr, NB: tl.constexpr,
                 WRITE_BMAX: tl.constexpr,
                 CPU: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    p_row = P + row * stride_p
    q_row = Q + row * stride_q
    tok = tl.load(TOK + row)
    m_p, m_q, rank_p, rank_q = _maxima_and_ranks(
        p_row, q_row, row, tl.load(p_row + tok), tl.load(q_row + tok), V, BMAX_P, BMAX_Q,
        NBLK, BLOCK, TOPK_BLOCK, NB, WRITE_BMAX)
    ls_p64, ls_q64 = _log_sums(p_row, q_row, m_p, m_q, V, BLOCK, CPU)
    kl_pq, kl_qp, h_p, h_q, js = _divergence_sums(p_row, q_row, m_p, m_q, ls_p64, ls_q64, V,
                                                  BLOCK, CPU)
    tl.store(MAX_P + row, m_p)
    tl.store(MAX_Q + row, m_q)
    tl.store(LOGSUM_P + row, ls_p64)
    tl.store(LOGSUM_Q + row, ls_q64)
    tl.store(SUMS + row * 5 + 0, kl_pq)
    tl.store(SUMS + row * 5 + 1, kl_qp)
    tl.store(SUMS + row * 5 + 2, h_p)
    tl.store(SUMS + row * 5 + 3, h_q)
    tl.store(SUMS + row * 5 + 4, js)
    tl.store(RANKS + row * 2 + 0, rank_p)
    tl.store(RANKS + row * 2 + 1, rank_q)


def row_reductions(logits_p: torch.Tensor, logits_q: torch.Tensor, token_ids: torch.Tensor,
                   block: int = BLOCK, num_warps: int = NUM_WARPS) -> dict[str, torch.Tensor]:
    """Per-row max, float64 log-sum-exp of the shifted logits, the five float64 sums
    (KL(P||Q), KL(Q||P), H(P), H(Q), JS), the two ranks and (when the block is a multiple
    of TOPK_BLOCK) the maxima of TOPK_BLOCK-wide blocks, for [n, V] float32 logits."""
    n, v = logits_p.shape
    if logits_p.stride(1) != 1 or logits_q.stride(1) != 1:
        raise ValueError("fused metrics need logits contiguous along the vocabulary")
    dev = logits_p.device
    out = {
        "max_p": torch.empty(n, dtype=torch.float32, device=dev),
        "max_q": torch.empty(n, dtype=torch.float32, device=dev),
        "logsum_p": torch.empty(n, dtype=torch.float64, device=dev),
        "logsum_q": torch.empty(n, dtype=torch.float64, device=dev),
        "sums": torch.empty(n, 5, dtype=torch.float64, device=dev),
        "ranks": torch.empty(n, 2, dtype=torch.int32, device=dev),
    }
    block = min(block, triton.next_power_of_2(v))
    write_bmax = block % TOPK_BLOCK == 0
    nblk = triton.cdiv(v, TOPK_BLOCK)
    if write_bmax:
        out["block_max_p"] = torch.empty(n, nblk, dtype=torch.float32, device=dev)
        out["block_max_q"] = torch.empty(n, nblk, dtype=torch.float32, device=dev)
    if n:
        _rows_kernel[(n,)](logits_p, logits_q, token_ids.contiguous(), v,
                           logits_p.stride(0), logits_q.stride(0),
                           out["max_p"], out["max_q"], out["logsum_p"], out["logsum_q"],
                           out["sums"], out["ranks"],
                           out.get("block_max_p", out["max_p"]),
                           out.get("block_max_q", out["max_q"]), nblk,
                           BLOCK=block, TOPK_BLOCK=TOPK_BLOCK, NB=max(1, block // TOPK_BLOCK),
                           WRITE_BMAX=write_bmax,
                           CPU=INTERPRETED, num_warps=num_warps)
    return out

