"""The estimator lab: how the sampled-token estimators k1, k2, k3 that RL trainers use as
a KL penalty relate to the exact KL in both directions, per token and per sequence, what
each one's mean actually targets when the tokens were sampled at a temperature, and a
check on real tables where the answer is known.

**Notation.** At one position, q is the reference's next-token distribution, p the
checkpoint's (both over the whole vocabulary, p > 0 wherever q > 0, as softmaxes are),
and q_T ∝ q^(1/T) the reference at temperature T, with Z_T = sum_v q_v^(1/T). For the
written token x, r = p(x) / q(x) and

    k1 = −log r,    k2 = (log r)^2 / 2,    k3 = (r − 1) − log r.

**What each mean targets for x ~ q_T** (``tempered_targets`` computes all of them from full
distributions):

* k1: E_{q_T}[k1] = sum_v q_T(v) log(q(v) / p(v))
                  = sum_v q_T(v) [log(q_T(v) / p(v)) − log(q_T(v) / q(v))]
                  = KL(q_T‖p) − KL(q_T‖q).
  At T = 1, KL(q_T‖q) = 0: E_q[k1] = KL(q‖p) = KL(ref‖ckpt).
* k3: k3 = r − 1 + k1, so
      E_{q_T}[k3] = E_{q_T}[p/q] − 1 + KL(q_T‖p) − KL(q_T‖q),
  with E_{q_T}[p/q] = sum_v q_T(v) p(v) / q(v) = sum_v p(v) q(v)^(1/T − 1) / Z_T. At
  T = 1 that is sum_v p(v) = 1 and E_q[k3] = KL(q‖p) too; at T ≠ 1 the extra term
  E_{q_T}[p/q] − 1 is not 0 (for T < 1 it is positive when the checkpoint moved mass
  towards the reference's likely tokens, negative when away), so k3 is *not* biased like
  k1: it carries its own term, and unlike k1 its mean is never negative (k3 >= 0).
* k2: E_{q_T}[k2] = E_{q_T}[(log p/q)^2] / 2, half the second moment of the log-ratio.
  It is not KL(q‖p) even at T = 1, where it agrees with it to second order in log r.
* None of them estimates KL(ckpt‖ref), the direction a trainer sampling from its policy
  penalises: that needs tokens drawn from the checkpoint.

**Reweighting.** With w(x) = q(x) / q_T(x) = q(x)^(1 − 1/T) Z_T, E_{q_T}[w k] = E_q[k]:
the reweighted means of k1 and k3 target KL(ref‖ckpt) again at every temperature
(``reweighted_table``). The token table keeps only the reference's top-k probabilities, so
Z_T is bounded: the top-k terms exactly plus the tail's, which lies in [0, tail q_k^(1/T −
1)] for T < 1 and in [tail q_k^(1/T − 1), (V − k)^(1 − 1/T) tail^(1/T)] for T > 1 (tail =
1 − top-k mass, q_k the k-th probability, V the vocabulary size; unbounded without V).
Each row of the table gets a verdict: does the reweighted mean meet the exact mean within
its interval (sampling interval over problems, widened by the weights' bounds)?

**Selection.** All of this holds for tokens *drawn* from q_T. The book forces the
reference's finished, wrong rollouts: a selection on how a rollout ends, which changes
the distribution of every token before the end (tokens that lead to a wrong answer are
over-represented). So in the target group neither the plain nor the reweighted means
need meet the exact mean, whatever the temperature; a miss there measures selection and
temperature together. The forcing policy ``t1_unselected`` (``forcing.plan``) forces a few
rollouts sampled at T = 1 whatever their outcome: there, and only there, k1 and k3 must
meet the exact KL(ref‖ckpt) within their intervals (``t1_check``), and they are the
lab's control on real tables.

**Temperature and problem.** A group's rollouts at one temperature come from some of its
problems and those at another from others, so a difference between temperatures can be a
difference between problems. ``temperature_problems`` shows which problems each
temperature has; ``same_problems`` keeps the problems present at every temperature.

What the table cannot give: E_{q_T}[k_j] per position, which needs both models' full
distributions. The cached reference hidden states and LM heads of notebook 03 hold them;
the function we would want from the engine is

    exact_expectation_under_temperature(P, checkpoint, temperatures=None) -> DataFrame
        one row per (rollout_id, pos, temperature) of the pair's token table, with e_k1,
        e_k2, e_k3 (``tempered_targets``), computed in the same chunked float32 LM-head
        pass as the token table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb import reporting
from rlprobe_nb.divergence import clustered
from rlprobe_nb.divergence.entropy_concentration import _topk_matrix
from rlprobe_nb.divergence.summary import KEYS, analysed_rows

ESTIMATORS = ("k1", "k2", "k3")
TARGETS = ("kl_ref_ckpt", "kl_ckpt_ref")
UNSELECTED = "t1_unselected"  # the forcing policy's group of unselected T = 1 rollouts
# What the mean of each estimator targets for tokens drawn from q_T (see the docstring).
TARGET_UNDER_T = {
    "k1": "KL(q_T‖ckpt) − KL(q_T‖ref)",
    "k2": "E_{q_T}[(log ckpt/ref)²] / 2",
    "k3": "KL(q_T‖ckpt) − KL(q_T‖ref) + E_{q_T}[ckpt/ref] − 1",
}


def tempered_targets(logp: np.ndarray, logq: np.ndarray, temperature: float) -> dict:
    """The exact mean of each estimator over tokens drawn from q_T, per position, from the
    full log-distributions of the checkpoint (``logp``) and the reference (``logq``),
    [..., V] in nats. Returns e_k1, e_k2, e_k3 and their parts: kl_qT_p = KL(q_T‖p),
    kl_qT_q = KL(q_T‖q), ratio_term = E_{q_T}[p/q] − 1, and kl_q_p = KL(q‖p)."""
    logp, logq = np.asarray(logp, np.float64), np.asarray(logq, np.float64)
    z = logq / temperature
    log_qt = z - np.logaddexp.reduce(z, axis=-1, keepdims=True)
    qt, q = np.exp(log_qt), np.exp(logq)
    log_r = logp - logq
    kl_qt_p = np.sum(qt * (log_qt - logp), -1)
    kl_qt_q = np.sum(qt * (log_qt - logq), -1)
    ratio_term = np.sum(qt * np.expm1(log_r), -1)  # E_{q_T}[p/q] − 1, without cancellation
    e_k1 = np.sum(qt * -log_r, -1)
    return {"e_k1": e_k1, "e_k2": 0.5 * np.sum(qt * log_r ** 2, -1),
            "e_k3": ratio_term + e_k1, "kl_qT_p": kl_qt_p, "kl_qT_q": kl_qt_q,
            "ratio_term": ratio_term, "kl_q_p": np.sum(q * -log_r, -1)}


def temperature_labels(temperature: pd.Series) -> pd.Series:
    """A readable label per rollout temperature: "T=0.7", "greedy", "imported"."""
    t = temperature.astype(float)
    text = t.map(lambda v: f"T={v:g}")
    return text.where(t > 0, "greedy").where(t.notna(), "imported")


def sequence_means(rows: pd.DataFrame, columns) -> pd.DataFrame:
    """One row per rollout and step: the mean of ``columns`` over its tokens."""
    keys = ["group", "problem_id", "rollout_id", "temperature_label"] + KEYS
    return rows.groupby(keys, sort=True, observed=True)[list(columns)].mean().reset_index()


def estimator_table(tokens: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per group, step, temperature, level (token / sequence mean), estimator and target
    direction: mean estimate, mean exact value, bias = mean(k − exact) with its interval,
    relative bias, spread = sd(k − exact), Spearman's rank correlation of k and exact,
    ``largest_share`` (the one row with the largest |k − exact|: its share of the summed
    |k − exact|; near 1, the bias is one token) and ``meets_exact`` ("yes": the bias
    interval contains 0; "no"; or why it cannot tell)."""
    rows = analysed_rows(tokens)
    rows = rows.assign(temperature_label=temperature_labels(rows.temperature))
    levels = {"token": rows,
              "sequence": sequence_means(rows, ESTIMATORS + TARGETS)}
    keys = KEYS + ["temperature_label"]
    out = []
    pairs = [(k, target) for k in ESTIMATORS for target in TARGETS]
    for level, frame in levels.items():
        errors = frame.assign(**{f"{k}-{t}": frame[k] - frame[t] for k, t in pairs})
        biases = clustered.ratio_table(errors, keys, [f"{k}-{t}" for k, t in pairs], seed=seed)
        for k, target in pairs:
            table = biases[biases.metric == f"{k}-{target}"].drop(columns="metric")
            work = errors.rename(columns={f"{k}-{target}": "_error"})
            out.append(table.rename(columns={"estimate": "bias"}).merge(
                _describe(work, ["group"] + keys, k, target)).assign(
                level=level, estimator=k, target=target))
    table = pd.concat(out, ignore_index=True)
    table["relative_bias"] = table.bias / table.mean_exact.where(table.mean_exact != 0)
    table["meets_exact"] = [
        reporting.verdict_text(reporting.contains(0.0, r.bias, r.low, r.high, int(r.problems)),
                               int(r.problems)) for r in table.itertuples()]
    return table.sort_values(["group", "level", "estimator", "target", "step",
                              "temperature_label"], ignore_index=True)[
        ["group", "level", "estimator", "target", "step", "checkpoint", "temperature_label",
         "mean_estimate", "mean_exact", "bias", "low", "high", "relative_bias", "spread",
         "spearman", "largest_share", "meets_exact", "problems", "rows"]]


def _describe(work: pd.DataFrame, keys: list[str], k: str, target: str) -> pd.DataFrame:
    """Per key: means, sd of the error, the largest error's share and Spearman's
    correlation (Pearson of the ranks within the key; NaN where either side has no
    spread)."""
    grouped = work.groupby(keys, sort=True, observed=True)
    ranks = pd.DataFrame({"a": grouped[k].rank().to_numpy(),
                          "b": grouped[target].rank().to_numpy()})
    ranks = ranks.assign(ab=ranks.a * ranks.b, aa=ranks.a ** 2, bb=ranks.b ** 2)
    m = ranks.groupby([work[c].to_numpy() for c in keys], sort=True).mean()
    var_a, var_b = m.aa - m.a ** 2, m.bb - m.b ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        spearman = ((m.ab - m.a * m.b) / np.sqrt(var_a * var_b)).where(
            (var_a > 1e-12 * m.aa) & (var_b > 1e-12 * m.bb))
    size = work.assign(_size=work._error.abs()).groupby(keys, sort=True, observed=True)._size
    out = grouped.agg(mean_estimate=(k, "mean"), mean_exact=(target, "mean"),
                      spread=("_error", "std"))
    total = size.sum()
    out["largest_share"] = (size.max() / total.where(total > 0)).to_numpy()
    out["spearman"] = spearman.to_numpy()
    return out.reset_index()


def importance_weights(tokens: pd.DataFrame, vocab_size: int | None = None):
    """Bounds (low, high) on w = q(x) / q_T(x) for each row's written token x: exact at
    T = 1 (w = 1), NaN for greedy or imported rows (see the module's docstring)."""
    t = tokens.temperature.to_numpy(np.float64)
    inv = np.where(t > 0, 1.0 / np.where(t > 0, t, 1.0), np.nan)
    probs = _topk_matrix(tokens.topk_p_ref)
    tail = np.clip(1.0 - np.nansum(probs, axis=1), 0.0, 1.0)
    kth = np.nanmin(probs, axis=1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        top = np.nansum(probs ** inv[:, None], axis=1)
        edge = tail * kth ** (inv - 1.0)
        beyond = np.inf if vocab_size is None else (
            (vocab_size - probs.shape[1]) ** (1.0 - inv) * tail ** inv)
        z_low = top + np.where(inv > 1.0, 0.0, edge)
        z_high = top + np.where(inv > 1.0, edge, np.where(tail > 0, beyond, 0.0))
        z_low = np.where(inv == 1.0, 1.0, z_low)
        z_high = np.where(inv == 1.0, 1.0, z_high)
        scale = np.exp(tokens.logp_ref.to_numpy(np.float64) * (1.0 - inv))
    return scale * z_low, scale * z_high


def reweighted_table(tokens: pd.DataFrame, vocab_size: int | None = None,
                     seed: int = 0) -> pd.DataFrame:
    """Per group, step, temperature and estimator (k1, k3): the exact mean KL(ref‖ckpt),
    the plain mean of k, and the mean of w k with w at its lower and upper bound and at
    their midpoint (each targets KL(ref‖ckpt) when the tokens are draws from q_T). The
    error mean(w_mid k − exact) gets its interval over problems (``error_low`` ..
    ``error_high``), which ``low`` .. ``high`` widen by the weights' bounds; ``meets_exact``
    says whether that widened interval contains 0 ("yes" / "no" / why it cannot tell).
    Rows with unbounded weights (T > 1 without ``vocab_size``) or none (greedy, imported)
    are left out."""
    rows = analysed_rows(tokens)
    w_low, w_high = importance_weights(rows, vocab_size)
    rows = rows.assign(temperature_label=temperature_labels(rows.temperature))
    keys = ["group"] + KEYS + ["temperature_label"]
    ok = np.isfinite(w_low) & np.isfinite(w_high)
    out = []
    for k in ("k1", "k3"):
        value = rows[k].to_numpy(np.float64)
        work = rows[ok].assign(
            _low=(np.where(value >= 0, w_low, w_high) * value)[ok],
            _high=(np.where(value >= 0, w_high, w_low) * value)[ok],
            _mid=(0.5 * (w_low + w_high) * value)[ok])
        work = work.assign(_error=work._mid - work.kl_ref_ckpt)
        if work.empty:
            continue
        means = work.groupby(keys, sort=True, observed=True).agg(
            mean_exact=("kl_ref_ckpt", "mean"), mean_raw=(k, "mean"),
            reweighted_low=("_low", "mean"), reweighted_mid=("_mid", "mean"),
            reweighted_high=("_high", "mean")).reset_index()
        error = clustered.ratio_table(work, KEYS + ["temperature_label"], "_error",
                                      seed=seed).rename(columns={
                                          "estimate": "error_mid", "low": "error_low",
                                          "high": "error_high"}).drop(columns="se")
        out.append(means.merge(error, how="left").assign(estimator=k))
    columns = ["group", "estimator", "step", "checkpoint", "temperature_label", "mean_exact",
               "mean_raw", "reweighted_low", "reweighted_mid", "reweighted_high", "error_mid",
               "error_low", "error_high", "low", "high", "meets_exact", "problems", "rows"]
    if not out:
        return pd.DataFrame(columns=columns)
    table = pd.concat(out, ignore_index=True)
    table["low"] = table.error_low - (table.reweighted_mid - table.reweighted_low)
    table["high"] = table.error_high + (table.reweighted_high - table.reweighted_mid)
    table["meets_exact"] = [
        reporting.verdict_text(reporting.contains(0.0, r.error_mid, r.low, r.high,
                                                  int(r.problems)), int(r.problems))
        for r in table.itertuples()]
    return table.sort_values(["group", "estimator", "step", "temperature_label"],
                             ignore_index=True)[columns]


def t1_check(tokens: pd.DataFrame, seed: int = 0, alpha: float = 0.05,
             group: str = UNSELECTED) -> pd.DataFrame:
    """The lab's control on real tables: in the group of unselected rollouts sampled at
    T = 1, the token-level bias mean(k − KL(ref‖ckpt)) of k1 and k3 at every step, with
    *simultaneous* intervals over problems: the check is one claim about all its rows
    (2 estimators x S steps), so each row's interval is at level 1 − alpha / (2 S)
    (Bonferroni), and the check passes only if every row's interval contains 0
    (``meets_exact``). Per-row 95% intervals fail a right check far more often than 5%
    (simulated with 9 problems and five steps: in about one suite of seven, more with
    heavier tails): ten rows are ten chances, and with few problems each undercovers a
    little; k3's mean in particular is carried in part by rare tokens the checkpoint likes
    far more than the reference, so on a finite sample it sits below the KL more often
    than above. The simultaneous check passed 98 of 100 such suites. Empty when the suite
    forced no such group."""
    columns = ["estimator", "step", "checkpoint", "mean_estimate", "mean_exact", "bias",
               "low", "high", "level", "largest_share", "meets_exact", "problems", "rows"]
    chosen = tokens[(tokens.group == group) & (tokens.temperature.astype(float) == 1.0)]
    if chosen.empty:
        return pd.DataFrame(columns=columns)
    rows = analysed_rows(chosen)
    tests = 2 * rows.step.nunique()
    errors = rows.assign(k1=rows.k1 - rows.kl_ref_ckpt, k3=rows.k3 - rows.kl_ref_ckpt)
    table = clustered.ratio_table(errors, KEYS, ["k1", "k3"], seed=seed, alpha=alpha / tests)
    table = table.rename(columns={"metric": "estimator", "estimate": "bias"})
    means = rows.groupby(KEYS).agg(mean_exact=("kl_ref_ckpt", "mean"), k1=("k1", "mean"),
                                   k3=("k3", "mean")).reset_index().melt(
        KEYS + ["mean_exact"], ["k1", "k3"], var_name="estimator", value_name="mean_estimate")
    size = errors.melt(KEYS, ["k1", "k3"], var_name="estimator").assign(
        value=lambda d: d.value.abs()).groupby(KEYS + ["estimator"]).value
    share = (size.max() / size.sum().where(size.sum() > 0)).rename("largest_share").reset_index()
    table = table.merge(means).merge(share).assign(
        level=f"{100 * (1 - alpha / tests):.3g}% (simultaneous over {tests} rows)")
    table["meets_exact"] = [
        reporting.verdict_text(reporting.contains(0.0, r.bias, r.low, r.high, int(r.problems)),
                               int(r.problems)) for r in table.itertuples()]
    return table.sort_values(["estimator", "step"], ignore_index=True)[columns]


def temperature_problems(tokens: pd.DataFrame) -> pd.DataFrame:
    """Per group and problem, how many rollouts each temperature has (one checkpoint's
    rows suffice): which problems each temperature's estimates come from."""
    rollouts = tokens.drop_duplicates("rollout_id")
    label = temperature_labels(rollouts.temperature)
    return (rollouts.assign(temperature_label=label)
            .groupby(["group", "problem_id", "temperature_label"]).size()
            .unstack("temperature_label", fill_value=0).reset_index())


def same_problems(tokens: pd.DataFrame) -> pd.DataFrame:
    """The rows of the problems that have rollouts at every temperature of their group,
    so a difference between temperatures is not a difference between problems."""
    counts = temperature_problems(tokens).set_index(["group", "problem_id"])
    keep = []
    for _, part in counts.groupby(level="group"):
        present = part.loc[:, (part > 0).any()]  # the group's own temperatures
        keep += [key for key, row in present.iterrows() if (row > 0).all()]
    at = pd.MultiIndex.from_frame(tokens[["group", "problem_id"]])
    return tokens[at.isin(pd.MultiIndex.from_tuples(keep, names=["group", "problem_id"]))
                  if keep else np.zeros(len(tokens), bool)]


def estimator_scatter(tokens: pd.DataFrame, per_step: int = 300, seed: int = 0) -> pd.DataFrame:
    """A seeded sample of rows per step for the scatter of estimator against exact KL."""
    rows = analysed_rows(tokens)
    rows = rows.assign(temperature_label=temperature_labels(rows.temperature))
    cols = ["group", "step", "checkpoint", "temperature_label", "rollout_id", "pos"]
    shuffled = rows.sample(frac=1.0, random_state=seed)
    sample = shuffled[shuffled.groupby("step").cumcount().to_numpy() < per_step]
    return sample[cols + list(ESTIMATORS) + list(TARGETS)].sort_values(
        ["step", "rollout_id", "pos"]).reset_index(drop=True)
