"""A self-consistent synthetic per-token table for the chapter 04 tests: small-vocabulary
distributions for reference and checkpoints, tokens sampled from the reference at each
rollout's temperature, every metric computed exactly in float64 from them."""

from __future__ import annotations

import numpy as np
import pandas as pd

PIECES = ["So", " x", " =", " ", "1", "2", " +", "\n", "Step", " the", "$", "\\", "frac",
          "{", "}", " therefore", ".", ","]


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def pair_metrics(lp: np.ndarray, lq: np.ndarray, token: np.ndarray, topk: int) -> dict:
    """Every per-token column of the contract from log-probabilities [n, V] of the
    checkpoint (lp) and the reference (lq) and the written token ids."""
    p, q = np.exp(lp), np.exp(lq)
    rows = np.arange(len(token))
    d = lp - lq  # log(2p / (p + q)) = -log1p(expm1(-d) / 2): exactly 0 where p == q
    log_r = lp[rows, token] - lq[rows, token]
    order_p, order_q = np.argsort(-p, axis=1)[:, :topk], np.argsort(-q, axis=1)[:, :topk]
    return {
        "logp_ckpt": lp[rows, token], "logp_ref": lq[rows, token],
        "rank_ckpt": (lp > lp[rows, token][:, None]).sum(1) + 1,
        "rank_ref": (lq > lq[rows, token][:, None]).sum(1) + 1,
        "entropy_ckpt": -(p * lp).sum(1), "entropy_ref": -(q * lq).sum(1),
        "kl_ckpt_ref": (p * (lp - lq)).sum(1), "kl_ref_ckpt": (q * (lq - lp)).sum(1),
        "js": 0.5 * (p * -np.log1p(np.expm1(-d) / 2)).sum(1)
        + 0.5 * (q * -np.log1p(np.expm1(d) / 2)).sum(1),
        "k1": -log_r, "k2": 0.5 * log_r ** 2, "k3": np.expm1(log_r) - log_r,
        "topk_ids_ckpt": list(order_p), "topk_p_ckpt": list(np.take_along_axis(p, order_p, 1)),
        "topk_ids_ref": list(order_q), "topk_p_ref": list(np.take_along_axis(q, order_q, 1)),
    }


def synthetic_tokens(n_problems: int = 8, rollouts: int = 3, length: int = 24,
                     steps=(100, 200, 400), vocab: int = 8, topk: int = 5, seed: int = 0,
                     change: float = 1.0) -> pd.DataFrame:
    """Rows of checkpoints ``rlvr_step_N`` against reference ``dpo``. A checkpoint's
    logits are the reference's plus change x step/400 x a fixed per-position direction,
    so divergence grows with the step; ``change=0`` makes every checkpoint the
    reference."""
    rng = np.random.default_rng(seed)
    groups = ["target", "ref_right", "control"]
    plan = []
    for g, group in enumerate(groups):
        for pi in range(n_problems):
            problem = f"{group[:3]}{pi:02d}" if group == "control" else f"p{pi:02d}"
            for r in range(rollouts):
                n = int(rng.integers(length // 2, length + 1))
                plan.append((group, problem, f"{problem}#{group}{r}", n,
                             [0.6, 0.8, 1.0][r % 3], bool(rng.random() < 0.7)))
    frames = []
    problem_shift = {p: rng.normal(0, 0.8) for p in sorted({x[1] for x in plan})}
    for group, problem, rollout, n, temperature, finished in plan:
        z_ref = rng.normal(0, 2.0, size=(n, vocab)) * (1 + 0.3 * problem_shift[problem] ** 2)
        z_ref[0] = np.arange(vocab)[::-1] + problem_shift[problem]  # a prompt-only first row
        direction = rng.normal(0, 1.0, size=(n, vocab)) * (1 + abs(problem_shift[problem]))
        lq = _log_softmax(z_ref)
        q_t = np.exp(_log_softmax(z_ref / temperature))
        token = np.array([rng.choice(vocab, p=row) for row in q_t])
        pieces = [PIECES[i % len(PIECES)] for i in rng.integers(0, len(PIECES), n)]
        if finished:
            pieces[-1] = "<|im_end|>"
        ends = np.cumsum([0 if pc == "<|im_end|>" else len(pc) for pc in pieces])
        starts = np.concatenate([[0], ends[:-1]])
        for step in steps:
            lp = _log_softmax(z_ref + change * step / 400 * direction)
            cols = pair_metrics(lp, lq, token, topk)
            frames.append(pd.DataFrame({
                "suite": "synthetic", "checkpoint": f"rlvr_step_{step}", "reference": "dpo",
                "problem_id": problem, "rollout_id": rollout, "pos": np.arange(n),
                "token_id": token, "token": pieces, "char_start": starts, "char_end": ends,
                **cols, "step": step, "group": group,
                "failure_type": "boxed_wrong" if finished else "truncated",
                "temperature": np.float32(temperature), "first_token": np.arange(n) == 0,
                "context_id": np.arange(n), "shared_context": False,
                "dlogp": cols["logp_ckpt"] - cols["logp_ref"],
                "is_eos": np.array([pc == "<|im_end|>" for pc in pieces])}))
    return pd.concat(frames, ignore_index=True)
