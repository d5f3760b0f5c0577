"""Synthetic per-token tables with known truth, for the detector's calibration and power.

The mechanism is deliberately *not* the detector's own null model. Real next-token
distributions are simulated over a small vocabulary and the table is computed from them
with ``divergence.token_metrics`` in float32, so every row is internally consistent
(KLs, entropies, ranks and top-k lists all come from the same two distributions):

- reference logits: ``tau * z`` with ``z ~ N(0, I_V)`` and a temperature-like spread
  ``tau`` log-uniform per context, so entropies range from near-deterministic to near
  uniform;
- the written token is sampled from the reference at the rollout's temperature;
- rollouts of a problem share their first tokens (a prefix of random length): the
  contexts of that prefix are one context each, with one ``context_id``;
- a checkpoint is the reference plus Gaussian logit noise whose scale grows with the
  reference entropy and with the checkpoint's drift, correlated across checkpoints
  (an AR(1) path over steps);
- planted spikes change the logits by an exact amount, solved so that the planted change
  alone moves KL(ref‖ckpt) by the stated number of nats: *rejects* lowers the written
  token's logit, *endorses* raises it, *redistributes* raises one other token's logit while
  keeping the written token's probability fixed. The checkpoint's noise is added on top.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from rlprobe_nb.forcing.metrics import token_metrics
from rlprobe_nb.statistics import seed_from

KINDS = ("rejects", "endorses", "redistributes")


@dataclass
class Contexts:
    """Distinct predictive contexts of a synthetic suite and the rows that use them."""

    logits_ref: np.ndarray  # [n_ctx, V] float32
    context_id: np.ndarray  # [n_ctx] int64
    problem_id: np.ndarray  # [n_ctx] str
    rows: pd.DataFrame      # one row per (rollout, pos): ctx index, token_id, temperature


def make_contexts(n_problems: int = 40, rollouts: int = 3, length: tuple[int, int] = (30, 70),
                  vocab: int = 128, prefix: tuple[int, int] = (0, 6),
                  tau: tuple[float, float] = (0.3, 10.0), seed: int = 0) -> Contexts:
    """Contexts and rows of ``n_problems`` x ``rollouts`` synthetic responses.

    Each problem's rollouts share their first ``s`` tokens (``s`` uniform in ``prefix``),
    so positions ``0..s`` of every rollout of the problem share one context (position
    ``s`` shares the context but each rollout writes its own token there).
    """
    rng = np.random.default_rng(seed_from("contexts", seed))
    ctx_problem, rows = [], []
    for p in range(n_problems):
        shared = int(rng.integers(prefix[0], prefix[1] + 1))
        shared_ctx = list(range(len(ctx_problem), len(ctx_problem) + shared + 1))
        ctx_problem += [p] * (shared + 1)
        for r in range(rollouts):
            n_tok = int(rng.integers(max(length[0], shared + 1), max(length[1], shared + 1) + 1))
            own = list(range(len(ctx_problem), len(ctx_problem) + n_tok - shared - 1))
            ctx_problem += [p] * len(own)
            temp = float(rng.choice([0.6, 0.8, 1.0]))
            for pos, c in enumerate(shared_ctx + own):
                rows.append((p, r, pos, c, temp, pos < shared))
    rows = pd.DataFrame(rows, columns=["problem", "rollout", "pos", "ctx", "temperature",
                                       "in_prefix"])
    n_ctx = len(ctx_problem)
    spread = np.exp(rng.uniform(np.log(tau[0]), np.log(tau[1]), size=(n_ctx, 1)))
    logits = (spread * rng.standard_normal((n_ctx, vocab))).astype(np.float32)
    rows["token_id"] = _sample_written(logits, rows, rng)
    problem = np.array([f"p{p:03d}" for p in ctx_problem])
    # A real context id hashes the prompt and the tokens before pos; here the prefix
    # structure gives the same partition directly: one id per context index.
    context_id = np.array([seed_from("ctx", seed, c) for c in range(n_ctx)], dtype=np.int64)
    return Contexts(logits, context_id, problem, rows)


def _sample_written(logits: np.ndarray, rows: pd.DataFrame, rng) -> np.ndarray:
    """The written token of every row. Inside a shared prefix all rollouts write the same
    token (one draw per context); from the branching position on, each rollout draws."""
    scaled = logits[rows.ctx.to_numpy()] / rows.temperature.to_numpy()[:, None]
    prob = np.exp(scaled - scaled.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    draws = pd.Series((prob.cumsum(1) > rng.random((len(rows), 1))).argmax(1), index=rows.index)
    prefix = rows.in_prefix.to_numpy()
    first_draw = draws[prefix].groupby(rows.ctx[prefix]).first()
    draws[prefix] = rows.ctx[prefix].map(first_draw).to_numpy()
    return draws.to_numpy().astype(np.int64)


def _kl_binary(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """KL(Bernoulli(a) ‖ Bernoulli(b)) in nats."""
    return a * np.log(a / b) + (1 - a) * (np.log1p(-a) - np.log1p(-b))


def _solve_increasing(fn, target: np.ndarray, high: float = 500.0, iters: int = 80) -> np.ndarray:
    """The x in [0, high] with fn(x) = target, for fn increasing in x (vectorised bisection)."""
    lo, hi = np.zeros_like(target), np.full_like(target, high)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        with np.errstate(divide="ignore", over="ignore"):  # inf past the target is fine
            below = fn(mid) < target
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def plant_delta(logits_ref: np.ndarray, token: np.ndarray, kind: str, kl: np.ndarray,
                seed: int = 0) -> np.ndarray:
    """Logit changes [n, V] whose KL(ref‖ref + change) is exactly ``kl`` at each row.

    rejects / endorses move the written token's logit by -d / +d (the other tokens keep
    their ratios, so the whole KL sits on the written token); redistributes raises one
    other token (drawn among the reference's top 10 but the written one) by d and the
    written token's logit by log(1 + q~_j (e^d - 1)), which keeps its probability fixed.
    """
    z = logits_ref.astype(np.float64)
    lq = z - _logsumexp(z)
    n = len(z)
    rows = np.arange(n)
    q_x = np.exp(lq[rows, token])
    kl = np.broadcast_to(np.asarray(kl, dtype=np.float64), (n,))
    delta = np.zeros_like(z)
    if kind in ("rejects", "endorses"):
        sign = -1.0 if kind == "rejects" else 1.0
        logit_q = np.log(q_x) - np.log1p(-q_x)
        d = _solve_increasing(
            lambda d: _kl_binary(q_x, 1 / (1 + np.exp(-(logit_q + sign * d)))), kl)
        delta[rows, token] = sign * d
    elif kind == "redistributes":
        rng = np.random.default_rng(seed_from("redistribute", seed))
        share_off_x = np.exp(lq) / (1 - q_x)[:, None]  # each token's share of the mass not on x
        # Candidates: the reference's top 11 but the written token, holding at most half the
        # mass not on x (raising a token that already holds nearly all of it moves little).
        order = np.argsort(-z, axis=1)[:, :11]
        ok = (order != token[:, None]) & (np.take_along_axis(share_off_x, order, 1) <= 0.5)
        pick = np.array([rng.choice(c[m]) for c, m in zip(order, ok)])
        q_j = share_off_x[rows, pick]
        # KL = (1 - q_x) [log(1 + q~_j (e^d - 1)) - q~_j d]
        d = _solve_increasing(
            lambda d: (1 - q_x) * (np.log1p(q_j * np.expm1(d)) - q_j * d), kl)
        delta[rows, pick] = d
        delta[rows, token] = np.log1p(q_j * np.expm1(d))
    else:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return delta


def _logsumexp(z: np.ndarray) -> np.ndarray:
    top = z.max(1, keepdims=True)
    return top + np.log(np.exp(z - top).sum(1, keepdims=True))


def reference_prob_of_written(ctx: Contexts) -> pd.Series:
    """q(x) of each context's written token, for contexts with one written token only
    (the only ones where 'rejects the written token' means one thing)."""
    by_ctx = ctx.rows.groupby("ctx").token_id.agg(["first", "nunique"])
    single = by_ctx[by_ctx["nunique"] == 1]
    z = ctx.logits_ref[single.index].astype(np.float64)
    lq = z - _logsumexp(z)
    return pd.Series(np.exp(lq[np.arange(len(single)), single["first"].to_numpy()]),
                     index=single.index, name="q_written")


# Where each kind of plant makes sense: a rejection of a token the reference liked, an
# endorsement of one it hesitated over, a redistribution where mass exists off the token.
ELIGIBLE = {"rejects": (0.2, 1.0), "endorses": (0.02, 0.7), "redistributes": (0.0, 0.8)}


def choose_plants(ctx: Contexts, share: float, kls=(0.5, 1.0, 2.0, 4.0), kinds=KINDS,
                  seed: int = 0) -> pd.DataFrame:
    """``share`` of the distinct contexts, each given a kind and a planted KL (cycled),
    among the contexts where that kind is eligible. Columns ctx, kind, kl."""
    rng = np.random.default_rng(seed_from("plants", seed))
    q_x = reference_prob_of_written(ctx)
    n = int(round(share * len(ctx.logits_ref)))
    pool = rng.permutation(q_x.index.to_numpy())
    taken, out = set(), []
    for i in range(n):
        kind, kl = kinds[i % len(kinds)], kls[(i // len(kinds)) % len(kls)]
        lo, hi = ELIGIBLE[kind]
        pick = next(c for c in pool if c not in taken and lo <= q_x[c] <= hi)
        taken.add(pick)
        out.append((int(pick), kind, float(kl)))
    return pd.DataFrame(out, columns=["ctx", "kind", "kl"])


def checkpoint_logits(ctx: Contexts, drifts, plants: pd.DataFrame | None = None,
                      rho: float = 0.5, seed: int = 0) -> list[np.ndarray]:
    """Checkpoint logits at each step: reference + plants active at that step + noise.

    The noise is Gaussian per logit with scale ``drift * (0.25 + 0.75 H_ref / log V)``
    (more uncertain positions move more), an AR(1) path over steps with correlation rho.
    ``plants`` has columns ctx, kind, kl and ``step`` (index into ``drifts``).
    """
    rng = np.random.default_rng(seed_from("noise", seed))
    z = ctx.logits_ref.astype(np.float64)
    lq = z - _logsumexp(z)
    entropy = -(np.exp(lq) * lq).sum(1, keepdims=True)
    scale = 0.25 + 0.75 * entropy / np.log(z.shape[1])
    first_token = ctx.rows.groupby("ctx").token_id.first()
    eps = rng.standard_normal(z.shape)
    out = []
    for step, drift in enumerate(drifts):
        if step:
            eps = rho * eps + np.sqrt(1 - rho * rho) * rng.standard_normal(z.shape)
        logits = z + drift * scale * eps
        if plants is not None:
            for (kind, kl), group in plants[plants.step == step].groupby(["kind", "kl"]):
                idx = group.ctx.to_numpy()
                logits[idx] += plant_delta(z[idx], first_token[idx].to_numpy(), kind, kl,
                                           seed=seed_from(seed, step, kind, kl))
        out.append(logits.astype(np.float32))
    return out


@contextmanager
def _one_thread():
    """torch on one thread for the duration: tables of a few thousand rows by a small
    vocabulary are far too small for threads, and on busy shared cores threads make them
    an order of magnitude slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def token_table(ctx: Contexts, logits_ckpt: np.ndarray, checkpoint: str, step: int,
                suite: str = "synthetic", reference: str = "reference",
                topk: int = 5) -> pd.DataFrame:
    """The per-token table of one checkpoint, every metric from ``token_metrics``."""
    rows = ctx.rows
    idx = rows.ctx.to_numpy()
    tok = torch.from_numpy(rows.token_id.to_numpy().copy())
    with _one_thread():
        m = token_metrics(torch.from_numpy(logits_ckpt[idx]),
                          torch.from_numpy(ctx.logits_ref[idx]), tok, topk=topk)
    text = " w" + rows.token_id.astype(str)
    char_end = text.str.len().groupby([rows.problem, rows.rollout]).cumsum().to_numpy()
    n = len(rows)
    columns = {
        "suite": np.full(n, suite, dtype=object), "checkpoint": np.full(n, checkpoint, dtype=object),
        "reference": np.full(n, reference, dtype=object), "problem_id": ctx.problem_id[idx],
        "rollout_id": (ctx.problem_id[idx].astype(object) + "#"
                       + rows.rollout.astype(str).to_numpy().astype(object)),
        "pos": rows.pos.to_numpy().astype(np.int32),
        "token_id": rows.token_id.to_numpy().astype(np.int32), "token": text.to_numpy(),
        "char_start": (char_end - text.str.len().to_numpy()).astype(np.int32),
        "char_end": char_end.astype(np.int32),
    }
    for name, value in m.items():
        value = value.numpy()
        columns[name] = list(value) if value.ndim == 2 else value
    columns.update(
        group=np.full(n, "target", dtype=object), failure_type=np.full(n, "boxed_wrong", dtype=object),
        temperature=rows.temperature.to_numpy().astype(np.float32),
        first_token=rows.pos.to_numpy() == 0, context_id=ctx.context_id[idx],
        shared_context=rows.groupby("ctx").rollout.transform("nunique").to_numpy() > 1,
        dlogp=(columns["logp_ckpt"] - columns["logp_ref"]).astype(np.float32),
        is_eos=np.zeros(n, dtype=bool), step=np.full(n, step, dtype=np.int64))
    return pd.DataFrame(columns)


def simulate_tables(ctx: Contexts, drifts, steps=None, plants: pd.DataFrame | None = None,
                    seed: int = 0) -> pd.DataFrame:
    """All checkpoints' per-token tables concatenated, with a ``step`` column, as
    ``suite_tables.read_tokens`` returns them."""
    steps = list(steps) if steps is not None else [100 * (i + 1) for i in range(len(drifts))]
    logits = checkpoint_logits(ctx, drifts, plants, seed=seed)
    return pd.concat([token_table(ctx, lg, f"step_{s}", s) for lg, s in zip(logits, steps)],
                     ignore_index=True)


def null_like(tokens: pd.DataFrame, vocab: int = 128, max_problems: int = 400,
              seed: int = 0) -> pd.DataFrame:
    """A null table shaped like one checkpoint's ``tokens``: as many problems (at most
    ``max_problems``), rollouts per problem and tokens per rollout, and a drift chosen so
    that its median KL(ref‖ckpt) is the real one's, with nothing planted. The detector's
    p-values on it show what calibration looks like at this size, beside the real data's."""
    per_problem = tokens.groupby("problem_id").rollout_id.nunique()
    lengths = tokens.groupby("rollout_id").pos.max() + 1
    shape = dict(rollouts=max(1, int(per_problem.median())), vocab=vocab, seed=seed,
                 length=(int(lengths.quantile(0.1)), int(lengths.quantile(0.9))))
    probe = make_contexts(n_problems=min(len(per_problem), 20) or 2, **shape)
    drifts = np.geomspace(0.02, 3.0, 12)
    medians = np.array([token_table(probe, lg, "probe", 0).kl_ref_ckpt.median()
                        for lg in checkpoint_logits(probe, drifts, seed=seed)])
    target = max(float(tokens.kl_ref_ckpt.median()), 1e-12)
    drift = drifts[np.argmin(np.abs(np.log(np.maximum(medians, 1e-12) / target)))]
    ctx = make_contexts(n_problems=int(np.clip(len(per_problem), 2, max_problems)), **shape)
    return simulate_tables(ctx, [drift], steps=[0], seed=seed).assign(checkpoint="simulated null")
