"""A small synthetic suite with the per-token table's columns, exact and self-consistent,
for testing and benchmarking the renderer, the viewer and the case studies without a model.

Over a toy vocabulary (words, digits, whitespace, newlines, HTML-special characters,
non-ASCII), each position has reference logits; a checkpoint at step s adds a drift that
grows with s and, at a few planted positions, a large change to the written token's logit
from its onset step on (negative: a rejection, positive: an endorsement). Every metric is
computed exactly in float64 from those logits and stored as float32, as the real table is.
A matching spikes table has, for each planted position, a row at every step (``significant``
from its onset on), keyed like chapter 05's by checkpoint, rollout and position and by
``context_id`` (a hash of the problem and the tokens before, also a column of ``tokens``).
"""

from __future__ import annotations

import hashlib

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


def _token_frame(keys: dict, lq: np.ndarray, lp: np.ndarray, written: np.ndarray, texts: list[str],
                 topk: int) -> pd.DataFrame:
    """One (checkpoint, rollout)'s rows with the per-token table's columns and dtypes."""
    n = len(written)
    cols = _metrics(lq, lp, written, topk)
    lengths = np.array([len(t) for t in texts])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    f32 = {k: np.asarray(v, np.float32) for k, v in cols.items() if k.startswith(("logp", "entropy", "kl", "js"))}
    logr = f32["logp_ckpt"].astype(np.float64) - f32["logp_ref"]
    return pd.DataFrame({
        **keys, "pos": np.arange(n, dtype=np.int32), "token_id": written.astype(np.int32), "token": texts,
        "char_start": starts.astype(np.int32), "char_end": (starts + lengths).astype(np.int32), **f32,
        "rank_ckpt": cols["rank_ckpt"].astype(np.int32), "rank_ref": cols["rank_ref"].astype(np.int32),
        **{k: [a.astype(np.int32) for a in cols[k]] for k in ("topk_ids_ckpt", "topk_ids_ref")},
        **{k: [a.astype(np.float32) for a in cols[k]] for k in ("topk_p_ckpt", "topk_p_ref")},
        "k1": (-logr).astype(np.float32), "k2": (logr ** 2 / 2).astype(np.float32),
        "k3": (np.expm1(logr) - logr).astype(np.float32), "temperature": np.float32(0.7),
        "first_token": np.arange(n) == 0, "is_eos": written == EOS,
        "dlogp": f32["logp_ckpt"] - f32["logp_ref"],
    })


def _rollout(rng, keys: dict, n_tokens: int, steps: dict[str, int], n_spikes: int, topk: int):
    """One reference rollout forced through every checkpoint: (token frames, spike rows, text)."""
    ckpts = sorted(steps, key=steps.get)
    V = len(VOCAB)
    lq_logits = rng.normal(0, 2.0, (n_tokens, V))
    lq = _log_softmax(lq_logits)
    written = np.array([rng.choice(V, p=np.exp(row)) for row in lq])
    written[written == EOS] = 1
    written[-1] = EOS
    texts = ["" if w == EOS else VOCAB[w] for w in written]
    planted = rng.choice(np.arange(1, n_tokens - 1), n_spikes, replace=False)
    signs = rng.choice([-1.0, 1.0], n_spikes)
    onsets = rng.choice(len(ckpts), n_spikes)
    drift = rng.normal(0, 1.0, (n_tokens, V))
    context = [_context_id(keys["problem_id"], written[:pos]) for pos in range(n_tokens)]
    frames, spikes = [], []
    for ci, ck in enumerate(ckpts):
        shift = drift * 0.15 * steps[ck] / max(steps.values())
        for pos, sign, onset in zip(planted, signs, onsets):
            shift[pos, written[pos]] += sign * 4.0 if ci >= onset else 0.0
        frame = _token_frame({**keys, "checkpoint": ck, "step": steps[ck]}, lq, _log_softmax(lq_logits + shift),
                             written, texts, topk).assign(context_id=np.array(context, dtype=np.int64))
        frames.append(frame)
        for j, (pos, sign, onset) in enumerate(zip(planted, signs, onsets)):
            row = frame.iloc[pos]
            spikes.append({  # every step of a context that is a spike at one step or more
                **{k: keys[k] for k in ("suite", "reference", "group", "problem_id", "rollout_id")},
                "checkpoint": ck, "step": steps[ck], "pos": int(pos), "context_id": context[pos],
                "token_id": int(written[pos]), "token": texts[pos], "category": _category(texts[pos]),
                "first_token": False, "significant": ci >= onset, "statistic": float(row.kl_ref_ckpt),
                "p": 1e-4 * (j + 1) if ci >= onset else 0.2, "q": 1e-3 * (j + 1) * (ci + 1) if ci >= onset else 0.5,
                "sign": "rejects" if sign < 0 else "endorses", "dlogp": float(row.dlogp),
                "kl_ref_ckpt": float(row.kl_ref_ckpt), "kl_ckpt_ref": float(row.kl_ckpt_ref),
                "onset_step": steps[ckpts[onset]], "persistence": "persistent",
                "region_id": f"{keys['rollout_id']}@{pos}-{pos}" if ci >= onset else None})
    return frames, spikes, "".join(texts)


def _context_id(problem_id: str, before: np.ndarray) -> int:
    """A stable 63-bit id of the predictive context: the problem (its prompt) and the tokens before."""
    blob = problem_id.encode() + b"|" + np.asarray(before, dtype=np.int32).tobytes()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") >> 1


def synthetic_suite(n_problems: int = 3, rollouts_per_problem: int = 2, n_tokens: int = 60,
                    steps: dict[str, int] | None = None, spikes_per_rollout: int = 2,
                    seed: int = 0, topk: int = 5, suite: str = "synthetic") -> dict[str, pd.DataFrame]:
    """Tables ``tokens`` (with ``step``), ``spikes``, ``spike_tests``, ``rollouts``,
    ``problems``, ``answers``.
    Even rollouts are group "target" (the reference wrong), odd ones "ref_right"."""
    rng = np.random.default_rng(seed)
    steps = steps or {"rlvr_step_100": 100, "rlvr_step_400": 400, "rlvr_step_1200": 1200}
    frames, spikes, rollouts, problems, answers = [], [], [], [], []
    for pi in range(n_problems):
        pid = f"synthetic/{pi}"
        problems.append({"problem_id": pid, "problem": f"What is {pi + 5} + 7? <Show> & box it.",
                         "answer": str(pi + 12)})
        for model in ["dpo", *sorted(steps, key=steps.get)]:
            for s in range(3):
                good = rng.random() < (0.2 if model == "dpo" else 0.3 + steps[model] / 2000)
                answers.append({"model": model, "problem_id": pid, "sample": s,
                                "extracted": str(pi + 12 if good else pi + 11 + s), "correct": bool(good)})
        for r in range(rollouts_per_problem):
            group = "target" if r % 2 == 0 else "ref_right"
            failure = "boxed_wrong" if group == "target" else "correct"
            keys = {"suite": suite, "reference": "dpo", "problem_id": pid, "rollout_id": f"{pid}#{r}",
                    "group": group, "failure_type": failure}
            f, sp, text = _rollout(rng, keys, n_tokens, steps, spikes_per_rollout, topk)
            frames += f
            spikes += sp
            rollouts.append({"model": "dpo", "problem_id": pid, "rollout_id": keys["rollout_id"], "response": text,
                             "extracted": str(pi + 11), "correct": group != "target", "failure_type": failure,
                             "n_tokens": n_tokens})
    tokens = pd.concat(frames, ignore_index=True)
    return {"tokens": tokens, "spikes": pd.DataFrame(spikes), "spike_tests": _tests(tokens),
            "rollouts": pd.DataFrame(rollouts), "problems": pd.DataFrame(problems), "answers": pd.DataFrame(answers)}


def _tests(tokens: pd.DataFrame) -> pd.DataFrame:
    """Every row tested, shaped like chapter 05's ``spike_tests`` table: the divergence is KL
    both ways, the statistic the divergence, p and q made up from its rank within the step
    (the larger, the smaller), no row significant (the planted spikes are in ``spikes``)."""
    divergence = tokens.kl_ref_ckpt.astype(float) + tokens.kl_ckpt_ref.astype(float)
    rank = divergence.groupby(tokens.step).rank(ascending=False, method="first")
    return tokens.assign(divergence=divergence, statistic=divergence, p=1e-3 * rank, q=0.2 * rank,
                         sign=np.where(tokens.dlogp < 0, "rejects", "endorses"), significant=False)


def decode(token_id: int) -> str:
    """The toy vocabulary's text of ``token_id`` (EOS decodes to the empty string)."""
    return "" if token_id == EOS else VOCAB[token_id]
