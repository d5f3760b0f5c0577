"""The estimator lab: how the sampled-token estimators k1, k2, k3 that RL trainers use as
a KL penalty relate to the exact KL in both directions, per token and per sequence.

With log r = log p(x) − log q(x) for the written token x (p = checkpoint, q = reference),
k1 = −log r, k2 = (log r)^2 / 2, k3 = (r − 1) − log r. For x drawn from q itself (T = 1),
E_q[k1] = E_q[k3] = KL(q‖p) = KL(ref‖ckpt) exactly, and E_q[k2] agrees with it to second
order in log r. Here the forced tokens were sampled from the reference at the rollout's
temperature T, from q_T ∝ q^(1/T), so what each estimator's mean targets is

    E_{q_T}[k1] = KL(q_T‖p) − KL(q_T‖q),

which is KL(ref‖ckpt) only at T = 1; k3's mean is off at T ≠ 1 in the same way. None of them
estimates KL(ckpt‖ref), the direction a trainer sampling from its policy penalises: that
needs tokens from the checkpoint. ``estimator_table`` measures bias (mean of k − exact,
with its interval over problems), spread and rank correlation per step and temperature;
rows at T = 1 are the built-in control (no bias expected for k1, k3).

``reweighted_table`` checks that the bias is the temperature: with importance weights
w(x) = q(x) / q_T(x) = q(x)^(1 − 1/T) Z_T, Z_T = sum_v q_v^(1/T), the mean of w k1 and
w k3 targets KL(q‖p) again. The table stores only the reference's top-k probabilities,
so Z_T is bounded: the top-k terms exactly plus the tail's, which lies in
[0, tail q_k^(1/T − 1)] for T < 1 and in [tail q_k^(1/T − 1), (V − k)^(1 − 1/T) tail^(1/T)]
for T > 1 (tail = 1 − top-k mass, q_k = the k-th probability, V the vocabulary size; the
upper bound is infinite without V). Greedy rows (T = 0) have no such weight.

What the table cannot give: the exact expectation of each estimator under q_T per
position, E_{q_T}[k_j] = sum_v q_T(v) k_j(v), which needs both models' full
distributions. The cached reference hidden states and LM heads of notebook 03 hold them;
the function we would want from the engine is

    exact_expectation_under_temperature(P, checkpoint, temperatures=None) -> DataFrame
        one row per (rollout_id, pos, temperature) of the pair's token table, for each
        rollout's own temperature (None) or the given ones, with e_k1, e_k2, e_k3 =
        sum_v q_T(v) k_j(v), kl_qT_ckpt = KL(q_T‖p) and kl_qT_ref = KL(q_T‖q), computed
        in the same chunked float32 LM-head pass as the token table.

With it the lab would split each estimator's error per token into bias (e_kj − KL) and
sampling noise (k_j − e_kj) exactly, instead of as means over tokens.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb.divergence import clustered
from rlprobe_nb.divergence.entropy_concentration import _topk_matrix
from rlprobe_nb.divergence.summary import KEYS, analysed_rows

ESTIMATORS = ("k1", "k2", "k3")
TARGETS = ("kl_ref_ckpt", "kl_ckpt_ref")


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
    relative bias, spread = sd(k − exact) and Spearman's rank correlation of k and exact."""
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
    return table.sort_values(["group", "level", "estimator", "target", "step",
                              "temperature_label"], ignore_index=True)[
        ["group", "level", "estimator", "target", "step", "checkpoint", "temperature_label",
         "mean_estimate", "mean_exact", "bias", "low", "high", "relative_bias", "spread",
         "spearman", "problems", "rows"]]


def _describe(work: pd.DataFrame, keys: list[str], k: str, target: str) -> pd.DataFrame:
    """Per key: means, sd of the error and Spearman's correlation (Pearson of the ranks
    within the key; NaN where either side has no spread)."""
    grouped = work.groupby(keys, sort=True, observed=True)
    ranks = pd.DataFrame({"a": grouped[k].rank().to_numpy(),
                          "b": grouped[target].rank().to_numpy()})
    ranks = ranks.assign(ab=ranks.a * ranks.b, aa=ranks.a ** 2, bb=ranks.b ** 2)
    m = ranks.groupby([work[c].to_numpy() for c in keys], sort=True).mean()
    var_a, var_b = m.aa - m.a ** 2, m.bb - m.b ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        spearman = ((m.ab - m.a * m.b) / np.sqrt(var_a * var_b)).where(
            (var_a > 1e-12 * m.aa) & (var_b > 1e-12 * m.bb))
    out = grouped.agg(mean_estimate=(k, "mean"), mean_exact=(target, "mean"),
                      spread=("_error", "std"))
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
    """Per group, step and temperature: the exact mean KL(ref‖ckpt), and the means of
    w k1 and w k3 with w at its lower and upper bound (both target KL(ref‖ckpt) when the
    tokens come from q_T), with the interval of mean(w_mid k − exact), w_mid the midpoint
    of finite bounds."""
    rows = analysed_rows(tokens)
    w_low, w_high = importance_weights(rows, vocab_size)
    rows = rows.assign(temperature_label=temperature_labels(rows.temperature))
    keys = ["group"] + KEYS + ["temperature_label"]
    ok = np.isfinite(w_low)
    out = []
    for k in ("k1", "k3"):
        value = rows[k].to_numpy(np.float64)
        at_low = np.where(value >= 0, w_low, w_high) * value
        at_high = np.where(value >= 0, w_high, w_low) * value
        mid = np.where(np.isfinite(w_high), 0.5 * (w_low + w_high), np.nan) * value
        work = rows[ok].assign(_low=at_low[ok], _high=at_high[ok],
                               _error=(mid - rows.kl_ref_ckpt.to_numpy(np.float64))[ok])
        if work.empty:
            continue
        means = work.groupby(keys, sort=True, observed=True).agg(
            mean_exact=("kl_ref_ckpt", "mean"), mean_raw=(k, "mean"),
            reweighted_low=("_low", "mean"), reweighted_high=("_high", "mean")).reset_index()
        error = clustered.ratio_table(work[np.isfinite(work._error)], KEYS + ["temperature_label"],
                                      "_error", seed=seed).rename(columns={
                                          "estimate": "error_mid", "low": "error_low",
                                          "high": "error_high"})
        out.append(means.merge(error, how="left").assign(estimator=k))
    table = pd.concat(out, ignore_index=True)
    return table.sort_values(["group", "estimator", "step", "temperature_label"],
                             ignore_index=True)[
        ["group", "estimator", "step", "checkpoint", "temperature_label", "mean_exact",
         "mean_raw", "reweighted_low", "reweighted_high", "error_mid", "error_low",
         "error_high", "problems", "rows"]]


def estimator_scatter(tokens: pd.DataFrame, per_step: int = 300, seed: int = 0) -> pd.DataFrame:
    """A seeded sample of rows per step for the scatter of estimator against exact KL."""
    rows = analysed_rows(tokens)
    rows = rows.assign(temperature_label=temperature_labels(rows.temperature))
    cols = ["group", "step", "checkpoint", "temperature_label", "rollout_id", "pos"]
    shuffled = rows.sample(frac=1.0, random_state=seed)
    sample = shuffled[shuffled.groupby("step").cumcount().to_numpy() < per_step]
    return sample[cols + list(ESTIMATORS) + list(TARGETS)].sort_values(
        ["step", "rollout_id", "pos"]).reset_index(drop=True)
