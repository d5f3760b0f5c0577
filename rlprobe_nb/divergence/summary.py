"""How much, when and where each checkpoint departs from the reference: the aggregates of
chapter 04 over the concatenated per-token tables (``tables.suite_tables.read_tokens``).

Every function takes the rows of the checkpoints against *one* reference (the table's
``step`` column places each checkpoint; the reference is step 0) and returns a long
table, one row per group (``group``: target / ref_right / control) and step and whatever
else it splits by. Means and shares are ratios of per-problem totals with the paired
cluster bootstrap-t interval of ``clustered.ratio_table``: the problems of a group are
resampled with one count matrix for every step, so each checkpoint and each change
between steps is resampled with the same problems.

The first response token is left out of every aggregate except ``position_table``, where
it is shown on its own: its prediction depends on the prompt alone and repeats across
the rollouts of a problem. Rows that share a context (``shared_context``) are kept: they
are the same test repeated, which weights a problem's shared prefixes more, and they sit
in the same problem, so the intervals stay honest.

Directions (P = checkpoint, Q = reference): ``kl_ref_ckpt`` = KL(ref‖ckpt), how surprised
the checkpoint is by what the reference would write; ``kl_ckpt_ref`` = KL(ckpt‖ref), how
surprised the reference is by what the checkpoint would write; ``dlogp`` = log P − log Q
of the written token (negative: the checkpoint rejects what the reference wrote).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from rlprobe_nb.divergence import clustered
from rlprobe_nb.statistics import seed_from
from rlprobe_nb.tables import derived, provenance

METRICS = ("kl_ref_ckpt", "kl_ckpt_ref", "js", "dlogp")
KEYS = ["step", "checkpoint"]
NONNEGATIVE = (0.0, np.inf)
SHARE = (0.0, 1.0)
BOOTSTRAP = "paired cluster bootstrap-t over problems"
ITSELF = "exact: the reference against itself"


def bounds_of(metric: str) -> tuple[float, float]:
    """The range a mean of ``metric`` can take (divergences are >= 0, Δlogp is signed)."""
    return NONNEGATIVE if metric in ("kl_ref_ckpt", "kl_ckpt_ref", "js") else (-np.inf, np.inf)


def analysed_rows(tokens: pd.DataFrame) -> pd.DataFrame:
    """The rows the aggregates read: checkpoints against one reference, without the first
    response token."""
    references = tokens.reference.unique()
    if len(references) != 1:
        raise ValueError(f"expected the checkpoints against one reference, got {list(references)}:"
                         " select one first, e.g. tokens[tokens.reference == P.reference]")
    return tokens[~tokens.first_token.to_numpy(bool)]


def when_table(tokens: pd.DataFrame, metrics=METRICS, seed: int = 0) -> pd.DataFrame:
    """Per group, metric and step: the mean per token with its interval; the reference
    itself at step 0 (every metric is exactly 0 there)."""
    rows = analysed_rows(tokens)
    table = clustered.ratio_table(rows, KEYS, list(metrics), seed=seed,
                                  bounds={m: bounds_of(m) for m in metrics})
    table["method"] = BOOTSTRAP
    itself = (table.sort_values("step").groupby(["group", "metric"], as_index=False).first()
              .assign(step=0, checkpoint=tokens.reference.iloc[0], estimate=0.0, low=0.0,
                      high=0.0, se=0.0, method=ITSELF))
    table = pd.concat([itself, table], ignore_index=True)
    return table.sort_values(["group", "metric", "step"], ignore_index=True)[
        ["group", "metric", "step", "checkpoint", "estimate", "low", "high", "se", "problems",
         "rows", "method"]]


def per_problem_means(tokens: pd.DataFrame, metrics=METRICS) -> pd.DataFrame:
    """The mean per token of each problem at each step (the thin lines behind the means),
    the reference at step 0 with 0."""
    rows = analysed_rows(tokens)
    means = rows.groupby(["group", "problem_id"] + KEYS, sort=True)[list(metrics)].mean()
    long = means.reset_index().melt(["group", "problem_id"] + KEYS, var_name="metric",
                                    value_name="mean")
    itself = long.drop_duplicates(["group", "problem_id", "metric"]).assign(
        step=0, checkpoint=tokens.reference.iloc[0], mean=0.0)
    return pd.concat([itself, long], ignore_index=True).sort_values(
        ["group", "metric", "problem_id", "step"], ignore_index=True)


def step_changes(tokens: pd.DataFrame, metrics=METRICS, seed: int = 0) -> pd.DataFrame:
    """The change of each metric's mean from each step to the next (the first from the
    reference, where every metric is 0), on the tokens forced at both steps, with the
    interval of the paired per-token differences."""
    rows = analysed_rows(tokens)
    steps = sorted(rows.step.unique())
    by_step = {s: g.set_index(["rollout_id", "pos"]) for s, g in rows.groupby("step")}
    diffs = []
    first = by_step[steps[0]]
    diffs.append(first[["group", "problem_id"] + list(metrics)].assign(
        step_from=0, step_to=steps[0], checkpoint_from=tokens.reference.iloc[0],
        checkpoint_to=first.checkpoint))
    for a, b in zip(steps[:-1], steps[1:]):
        left, right = by_step[a], by_step[b]
        both = left.index.intersection(right.index)
        change = right.loc[both, list(metrics)] - left.loc[both, list(metrics)]
        diffs.append(change.assign(group=right.loc[both, "group"],
                                   problem_id=right.loc[both, "problem_id"], step_from=a,
                                   step_to=b, checkpoint_from=left.loc[both, "checkpoint"],
                                   checkpoint_to=right.loc[both, "checkpoint"]))
    diffs = pd.concat(diffs)
    keys = ["step_from", "step_to", "checkpoint_from", "checkpoint_to"]
    table = clustered.ratio_table(diffs, keys, list(metrics), seed=seed).rename(
        columns={"estimate": "change"})
    return table.sort_values(["group", "metric", "step_to"], ignore_index=True)[
        ["group", "metric"] + keys + ["change", "low", "high", "se", "problems", "rows"]]


def ecdf_table(tokens: pd.DataFrame, metric: str = "kl_ref_ckpt", points: int = 101,
               floor: float = 1e-6) -> pd.DataFrame:
    """The distribution of log10(metric) per group and step as ``points`` quantiles (an
    ECDF read sideways: ``share`` of tokens at or below ``log10_value``). Values below
    ``floor`` nats (within float32 rounding of 0 for this table) are shown at the floor;
    ``at_floor`` says how many."""
    rows = analysed_rows(tokens)
    probs = np.linspace(0.0, 1.0, points)
    out = []
    for (group, step, checkpoint), part in rows.groupby(["group"] + KEYS, sort=True):
        values = part[metric].to_numpy(np.float64)
        logs = np.log10(np.maximum(values, floor))
        out.append(pd.DataFrame({"group": group, "step": step, "checkpoint": checkpoint,
                                 "metric": metric, "share": probs,
                                 "log10_value": np.quantile(logs, probs),
                                 "at_floor": float(np.mean(values <= floor))}))
    return pd.concat(out, ignore_index=True)


def tail_table(tokens: pd.DataFrame, metric: str = "kl_ref_ckpt", quantiles=(0.9, 0.99),
               threshold: float = 1.0, seed: int = 0, bins: int = 2000) -> pd.DataFrame:
    """Per group and step: quantiles of the per-token metric and the share of tokens above
    ``threshold`` nats, with intervals.

    The share is a ratio (bootstrap-t). A quantile's replicates come from the same paired
    problem counts, each computed on a ``bins``-bin log10 histogram (resolution ~1% of the
    value) and turned into a t interval on the log scale (``clustered.replicate_interval``).
    A step where every value is 0 gets 0 with no spread.
    """
    rows = analysed_rows(tokens)
    above = clustered.ratio_table(rows.assign(_above=(rows[metric] > threshold).astype(float)),
                                  KEYS, "_above", seed=seed, bounds=SHARE)
    above["statistic"] = f"share above {threshold:g} nat"
    out = [above]
    for group, part in rows.groupby("group", sort=True):
        codes, names = clustered.problem_codes(part.problem_id)
        counts = clustered.bootstrap_counts(len(names), clustered.N_BOOT, seed_from(seed, group))
        for (step, checkpoint), idx in part.groupby(KEYS, sort=True).indices.items():
            values = part[metric].to_numpy(np.float64)[idx]
            out.append(_quantile_rows(values, codes[idx], counts, quantiles, bins).assign(
                group=group, step=step, checkpoint=checkpoint, rows=len(idx),
                problems=len(np.unique(codes[idx]))))
    table = pd.concat(out, ignore_index=True).assign(metric=metric)
    return table.sort_values(["group", "statistic", "step"], ignore_index=True)[
        ["group", "metric", "statistic", "step", "checkpoint", "estimate", "low", "high",
         "problems", "rows"]]


def _quantile_rows(values, codes, counts, quantiles, bins) -> pd.DataFrame:
    names = [f"p{100 * q:g}" for q in quantiles]
    estimate = np.quantile(values, quantiles)
    positive = values[values > 0]
    if len(positive) == 0:
        return pd.DataFrame({"statistic": names, "estimate": estimate, "low": estimate,
                             "high": estimate})
    lo, hi = np.log10(positive.min()), np.log10(positive.max()) + 1e-9
    edges = np.linspace(lo, hi, bins + 1)
    where = np.clip(np.searchsorted(edges, np.log10(np.maximum(values, 10 ** lo)), "right") - 1,
                    0, bins - 1)
    g = counts.shape[1]
    hist = np.bincount(codes * bins + where, minlength=g * bins).reshape(g, bins)
    cum = np.cumsum(counts @ hist, axis=1)  # [B, bins]
    out = {"statistic": names, "estimate": estimate, "low": [], "high": []}
    for q, est in zip(quantiles, estimate):
        target = q * cum[:, -1:]
        k = np.argmax(cum >= target, axis=1)
        below = np.where(k > 0, cum[np.arange(len(k)), k - 1], 0.0)
        inside = (cum[np.arange(len(k)), k] - below)
        frac = np.where(inside > 0, (target[:, 0] - below) / np.maximum(inside, 1e-300), 0.0)
        reps = edges[k] + frac * (edges[1] - edges[0])
        if est <= 0:  # a quantile inside the zeros: bounded below by 0
            out["low"].append(0.0)
            out["high"].append(float(10 ** np.quantile(reps, 0.975)))
            continue
        low, high = clustered.replicate_interval(np.log10(est), reps, g)
        out["low"].append(10 ** low)
        out["high"].append(10 ** high)
    return pd.DataFrame(out)


def position_bins(tokens: pd.DataFrame) -> pd.DataFrame:
    """Each row's place in its response: ``special`` (first token / EOS), the decile of
    its relative position pos / length (``relative``), and a doubling bin of its absolute
    position (``absolute``: 1, 2-3, 4-7, ...); the first token and EOS are in no bin."""
    length = tokens.groupby("rollout_id").pos.transform("max") + 1
    pos = tokens.pos.to_numpy()
    special = np.where(tokens.first_token.to_numpy(bool), "first token",
                       np.where(tokens.is_eos.to_numpy(bool), "EOS", ""))
    decile = np.minimum(10 * pos // length.to_numpy(), 9)
    doubling = np.floor(np.log2(np.maximum(pos, 1))).astype(int)
    return pd.DataFrame({"special": special, "decile": decile, "doubling": doubling},
                        index=tokens.index)


def position_table(tokens: pd.DataFrame, metrics=METRICS, seed: int = 0) -> pd.DataFrame:
    """Per group, step and place in the response (``position_bins``): each metric's mean
    per token with its interval. ``scheme`` is relative / absolute / special; ``bin`` a
    readable label, ``bin_order`` its order."""
    analysed_rows(tokens)  # one reference
    bins = position_bins(tokens)
    plain = bins.special == ""
    schemes = {
        "relative": (plain, bins.decile, lambda d: f"{10 * d}–{10 * d + 10}%"),
        "absolute": (plain, bins.doubling,
                     lambda b: f"{2 ** b}" if b == 0 else f"{2 ** b}–{2 ** (b + 1) - 1}"),
        "special": (~plain, bins.special.map({"first token": 0, "EOS": 1}),
                    lambda s: ["first token", "EOS"][s]),
    }
    out = []
    for scheme, (mask, order, label) in schemes.items():
        part = tokens[mask.to_numpy()].assign(bin_order=order[mask].to_numpy().astype(int))
        if part.empty:
            continue
        table = clustered.ratio_table(part, KEYS + ["bin_order"], list(metrics), seed=seed,
                                      bounds={m: bounds_of(m) for m in metrics})
        out.append(table.assign(scheme=scheme, bin=table.bin_order.map(label)))
    table = pd.concat(out, ignore_index=True)
    return table.sort_values(["group", "metric", "scheme", "bin_order", "step"],
                             ignore_index=True)[
        ["group", "metric", "scheme", "bin", "bin_order", "step", "checkpoint", "estimate",
         "low", "high", "se", "problems", "rows"]]


CATEGORY_STATISTICS = {
    # statistic: (numerator column, denominator column or None, shares of the step's total)
    "token_share": ("_one", "_one", True),
    "kl_ref_ckpt_share": ("kl_ref_ckpt", "kl_ref_ckpt", True),
    "kl_ckpt_ref_share": ("kl_ckpt_ref", "kl_ckpt_ref", True),
    "dlogp_mean": ("dlogp", None, False),
    "kl_ref_ckpt_mean": ("kl_ref_ckpt", None, False),
}


def category_table(tokens: pd.DataFrame, categories: pd.Series, seed: int = 0) -> pd.DataFrame:
    """Per group, step and token category (``categories`` aligned with ``tokens``, e.g.
    ``token_categories.classify(tokens)``): the category's share of the step's tokens, its
    share of the step's total KL in each direction, and its mean Δlogp and KL(ref‖ckpt),
    each with its interval. A share of a total that is 0 (a checkpoint equal to the
    reference) is NaN."""
    rows = analysed_rows(tokens.assign(category=categories.astype(str), _one=1.0))
    out = []
    for name, (num, den, share) in CATEGORY_STATISTICS.items():
        table = clustered.ratio_table(rows, KEYS + ["category"], num, den,
                                      den_keys=KEYS if share else None, seed=seed,
                                      bounds=SHARE if share else bounds_of(num))
        out.append(table.assign(statistic=name))
    table = pd.concat(out, ignore_index=True)
    return table.sort_values(["group", "statistic", "category", "step"], ignore_index=True)[
        ["group", "statistic", "category", "step", "checkpoint", "estimate", "low", "high",
         "se", "problems", "rows"]]


def step_similarity(tokens: pd.DataFrame, metric: str = "kl_ref_ckpt",
                    seed: int = 0) -> pd.DataFrame:
    """Spearman's rank correlation of the per-token metric between every two steps, on the
    tokens forced at both (matched on rollout_id, pos): do the same tokens change all
    along? The interval comes from the paired problem replicates with the ranks held
    fixed (a weighted Pearson correlation of the ranks; re-ranking each replicate would
    move it by O(1/tokens)); a metric with no spread gives NaN."""
    rows = analysed_rows(tokens)
    out = []
    for group, part in rows.groupby("group", sort=True):
        wide = part.pivot_table(index=["problem_id", "rollout_id", "pos"], columns="step",
                                values=metric, aggfunc="first")
        names = part.drop_duplicates("step").set_index("step").checkpoint
        codes, problems = clustered.problem_codes(wide.index.get_level_values("problem_id"))
        counts = clustered.bootstrap_counts(len(problems), clustered.N_BOOT, seed_from(seed, group))
        for i, a in enumerate(wide.columns):
            for b in wide.columns[i + 1:]:
                both = wide[[a, b]].dropna()
                keep = wide[[a, b]].notna().all(axis=1).to_numpy()
                rho, low, high = _rank_correlation(both[a].to_numpy(), both[b].to_numpy(),
                                                   codes[keep], counts)
                out.append({"group": group, "metric": metric, "step_a": a, "step_b": b,
                            "checkpoint_a": names[a], "checkpoint_b": names[b],
                            "spearman": rho, "low": low, "high": high,
                            "problems": len(np.unique(codes[keep])), "rows": len(both)})
    return pd.DataFrame(out)


def _rank_correlation(x, y, codes, counts):
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan"), float("nan"), float("nan")
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    rho = float(np.corrcoef(rx, ry)[0, 1])
    g = counts.shape[1]
    moments = np.stack([np.bincount(codes, weights=w, minlength=g)
                        for w in (np.ones_like(rx), rx, ry, rx * rx, ry * ry, rx * ry)], axis=1)
    n, sx, sy, sxx, syy, sxy = (counts @ moments).T
    with np.errstate(invalid="ignore", divide="ignore"):
        cov = sxy / n - sx * sy / n ** 2
        reps = cov / np.sqrt((sxx / n - (sx / n) ** 2) * (syy / n - (sy / n) ** 2))
    low, high = clustered.replicate_interval(rho, reps, len(np.unique(codes)))
    return rho, max(low, -1.0), min(high, 1.0)


# Chapter 04's tables (each with its schema in ``schemas.TABLES``), in the chapter's order.
TABLES = ("divergence_when", "divergence_per_problem", "divergence_changes",
          "divergence_ground_truth", "divergence_change_by_label", "divergence_onsets",
          "divergence_ecdf", "divergence_tails", "divergence_position", "divergence_categories",
          "divergence_contrasts", "divergence_similarity", "entropy_deciles", "entropy_share",
          "estimator_lab", "estimator_reweighted")


def chapter_tables(P, tokens: pd.DataFrame, seed: int, min_problems: int,
                   overwrite: bool = False) -> derived.ChapterTables:
    """Chapter 04's tables, each reused when complete with the same inputs, else computed
    (``tables.derived``: another key is refused unless ``overwrite``). Their rows depend on
    the token tables, the chapter's code, the bootstrap ``seed`` and ``min_problems`` (the
    fewest problems an onset or a contrast is read from)."""
    manifest = provenance.manifest(P, seeds={"bootstrap": seed, "n_boot": clustered.N_BOOT},
                                   extra={"token_rows": len(tokens),
                                          "checkpoints": sorted(tokens.checkpoint.unique())})
    settings = {"seed": seed, "min_problems": min_problems}
    return derived.ChapterTables(P, "notebooks/04_divergence", dict.fromkeys(TABLES, settings),
                                 manifest, overwrite=overwrite)
