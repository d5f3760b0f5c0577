"""A small synthetic suite with the per-token table's columns, exact and self-consistent,
for testing and benchmarking the renderer, the viewer and the case studies without a model.

Over a toy vocabulary (words, digits, whitespace, newlines, HTML-special characters,
non-ASCII), each position has reference logits; a checkpoint at step s adds a drift that
grows with s and, at a few planted positions, a large change to the written token's logit
from its onset step on (negative: a rejection, positive: an endorsement). Every metric is
computed exactly in float64 from those logits and stored as float32, as the real table is.
A matching spikes table marks the planted positions with the columns the renderer reads.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

VOCAB = ["<eos>", " the", " answer", " is", " 12", " 7", " +", " =", "\n", "\n\n", " ",
         " \\boxed{", "}", " <b>", " &amp;", ' "quoted"', " café", " → ", " x", " so",
         " we", " get", " 3", "4", "5", ".", ",", " Let", " compute", " first", " then",
         " total", " of", " and", " wait", " check", " maybe", " not", " 's", "\t"]
EOS = 0
CATEGORIES = ["number", "operator", "word", "format"]


def _category(text: str) -> str:
    t = text.strip()
    if t[:1].isdigit():
        return "number"
    if t in {"+", "=", "→"}:
        return "operator"
    if t in {"", "}", "\\boxed{", ".", ","} or t.startswith("<"):
        return "format"
    return "word"


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _metrics(lq: np.ndarray, lp: np.ndarray, written: np.ndarray, topk: int) -> dict:
    """Exact per-position metrics from log-probs of reference (lq) and checkpoint (lp)."""
    q, p = np.exp(lq), np.exp(lp)
    m = 0.5 * (p + q)
    idx = np.arange(len(written))
    rank = lambda lg: 1 + (lg > lg[idx, written][:, None]).sum(-1)
    order_p, order_q = np.argsort(-p, -1, kind="stable")[:, :topk], np.argsort(-q, -1, kind="stable")[:, :topk]
    return {
        "logp_ckpt": lp[idx, written], "logp_ref": lq[idx, written],
        "rank_ckpt": rank(lp), "rank_ref": rank(lq),
        "entropy_ckpt": -(p * lp).sum(-1), "entropy_ref": -(q * lq).sum(-1),
        "kl_ckpt_ref": (p * (lp - lq)).sum(-1), "kl_ref_ckpt": (q * (lq - lp)).sum(-1),
        "js": 0.5 * (p * (lp - np.log(m))).sum(-1) + 0.5 * (q * (lq - np.log(m))).sum(-1),
        "topk_ids_ckpt": list(order_p), "topk_p_ckpt": list(np.take_along_axis(p, order_p, -1)),
        "topk_ids_ref": list(order_q), "topk_p_ref": list(np.take_along_axis(q, order_q, -1)),
    }


def synthetic_suite(n_problems: int = 3, rollouts_per_problem: int = 2, n_tokens: int = 60,
                    steps: dict[str, int] | None = None, spikes_per_rollout: int = 2,
                    seed: int = 0, topk: int = 5, suite: str = "synthetic") -> dict[str, pd.DataFrame]:
    """Tables ``tokens`` (with ``step``), ``spikes``, ``rollouts``, ``problems``, ``answers``."""
    rng = np.random.default_rng(seed)
    steps = steps or {"rlvr_step_100": 100, "rlvr_step_400": 400, "rlvr_step_1200": 1200}
    ckpts = sorted(steps, key=steps.get)
    V = len(VOCAB)
    token_rows, spike_rows, rollout_rows, problem_rows, answer_rows = [], [], [], [], []
    for pi in range(n_problems):
        pid = f"synthetic/{pi}"
        problem_rows.append({"problem_id": pid, "problem": f"What is {pi + 5} + 7? <Show> & box it.",
                             "answer": str(pi + 12)})
        for model in ["dpo", *ckpts]:
            for s in range(3):
                good = rng.random() < (0.2 if model == "dpo" else 0.3 + steps.get(model, 0) / 2000)
                answer_rows.append({"model": model, "problem_id": pid, "sample": s,
                                    "extracted": str(pi + 12 if good else pi + 11 + s), "correct": bool(good)})
        for r in range(rollouts_per_problem):
            rid = f"{pid}#{r}"
            group = "target" if r % 2 == 0 else "ref_right"
            lq_logits = rng.normal(0, 2.0, (n_tokens, V))
            lq = _log_softmax(lq_logits)
            written = np.array([rng.choice(V, p=np.exp(row)) for row in lq])
            written[written == EOS] = 1
            written[-1] = EOS
            texts = ["" if w == EOS else VOCAB[w] for w in written]
            starts = np.cumsum([0] + [len(t) for t in texts[:-1]])
            response = "".join(texts)
            planted = rng.choice(np.arange(1, n_tokens - 1), spikes_per_rollout, replace=False)
            signs = rng.choice([-1.0, 1.0], spikes_per_rollout)
            onsets = rng.choice(len(ckpts), spikes_per_rollout)
            drift_dir = rng.normal(0, 1.0, (n_tokens, V))
            failure = "boxed_wrong" if group == "target" else "correct"
            rollout_rows.append({"model": "dpo", "problem_id": pid, "rollout_id": rid, "response": response,
                                 "extracted": str(pi + 11), "correct": group != "target",
                                 "failure_type": failure, "n_tokens": n_tokens})
            for ci, ck in enumerate(ckpts):
                shift = drift_dir * 0.15 * steps[ck] / max(steps.values())
                for pos, sign, onset in zip(planted, signs, onsets):
                    if ci >= onset:
                        shift[pos, written[pos]] += sign * 4.0
                lp = _log_softmax(lq_logits + shift)
                cols = _metrics(lq, lp, written, topk)
                logr = cols["logp_ckpt"] - cols["logp_ref"]
                frame = pd.DataFrame({
                    "suite": suite, "checkpoint": ck, "reference": "dpo", "problem_id": pid,
                    "rollout_id": rid, "pos": np.arange(n_tokens, dtype=np.int32),
                    "token_id": written.astype(np.int32), "token": texts,
                    "char_start": starts.astype(np.int32), "char_end": (starts + [len(t) for t in texts]).astype(np.int32),
                    **{k: (np.asarray(v, np.float32) if k.startswith(("logp", "entropy", "kl", "js")) else v)
                       for k, v in cols.items()},
                    "k1": (-logr).astype(np.float32), "k2": (logr ** 2 / 2).astype(np.float32),
                    "k3": (np.expm1(logr) - logr).astype(np.float32),
                    "group": group, "failure_type": failure, "temperature": np.float32(0.7),
                    "first_token": np.arange(n_tokens) == 0, "is_eos": written == EOS,
                    "dlogp": (cols["logp_ckpt"].astype(np.float32) - cols["logp_ref"].astype(np.float32)),
                    "step": steps[ck],
                })
                frame["rank_ckpt"] = frame.rank_ckpt.astype(np.int32)
                frame["rank_ref"] = frame.rank_ref.astype(np.int32)
                frame["topk_ids_ckpt"] = [a.astype(np.int32) for a in frame.topk_ids_ckpt]
                frame["topk_ids_ref"] = [a.astype(np.int32) for a in frame.topk_ids_ref]
                frame["topk_p_ckpt"] = [a.astype(np.float32) for a in frame.topk_p_ckpt]
                frame["topk_p_ref"] = [a.astype(np.float32) for a in frame.topk_p_ref]
                token_rows.append(frame)
                for j, (pos, sign, onset) in enumerate(zip(planted, signs, onsets)):
                    if ci < onset:
                        continue
                    row = frame.iloc[pos]
                    spike_rows.append({
                        "suite": suite, "checkpoint": ck, "reference": "dpo", "group": group,
                        "problem_id": pid, "rollout_id": rid, "pos": int(pos), "token": texts[pos],
                        "category": _category(texts[pos]), "statistic": float(row.kl_ref_ckpt),
                        "p": float(1e-4 * (j + 1)), "q": float(1e-3 * (j + 1) * (ci + 1)),
                        "sign_class": "reject" if sign < 0 else "endorse", "dlogp": float(row.dlogp),
                        "kl_ref_ckpt": float(row.kl_ref_ckpt), "kl_ckpt_ref": float(row.kl_ckpt_ref),
                        "onset_step": steps[ckpts[onset]], "persistence": "persistent",
                        "region_id": f"{rid}:{pos}"})
    tokens = pd.concat(token_rows, ignore_index=True)
    return {"tokens": tokens, "spikes": pd.DataFrame(spike_rows), "rollouts": pd.DataFrame(rollout_rows),
            "problems": pd.DataFrame(problem_rows), "answers": pd.DataFrame(answer_rows)}


def decode(token_id: int) -> str:
    """The toy vocabulary's text of ``token_id`` (EOS decodes to the empty string)."""
    return "" if token_id == EOS else VOCAB[token_id]
