"""Intervals for tokens clustered in problems: exact formulas against float64 references,
and coverage on simulated data with problem-level random effects."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from rlprobe_nb.divergence import clustered

ICC = 0.3


def _cr2_by_matrices(values, problems, alpha=0.05):
    """CR2 and Bell–McCaffrey df for the intercept-only regression, written out with the
    hat matrix, the adjustment matrices (I - H_gg)^(-1/2) and the eigenvalues of G'G."""
    y = np.asarray(values, dtype=np.float64)
    n = len(y)
    x = np.ones((n, 1))
    hat = x @ np.linalg.inv(x.T @ x) @ x.T
    resid = y - hat @ y
    groups = [np.flatnonzero(problems == g) for g in np.unique(problems)]
    meat, columns = 0.0, []
    for idx in groups:
        w, v = np.linalg.eigh(np.eye(len(idx)) - hat[np.ix_(idx, idx)])
        adjust = v @ np.diag(w ** -0.5) @ v.T
        a = np.zeros(n)
        a[idx] = adjust @ x[idx, 0] / n
        meat += (a @ resid) ** 2
        columns.append((np.eye(n) - hat) @ a)
    g = np.array(columns).T
    lam = np.linalg.eigvalsh(g.T @ g)
    df = lam.sum() ** 2 / (lam ** 2).sum()
    half = stats.t.ppf(1 - alpha / 2, df) * np.sqrt(meat)
    return y.mean(), np.sqrt(meat), df, y.mean() - half, y.mean() + half


@pytest.mark.parametrize("sizes", [[3, 3, 3, 3], [1, 7, 2, 12, 5], [40, 2, 2, 3, 9, 1, 6]])
def test_cr2_interval_matches_the_matrix_formulas(sizes):
    rng = np.random.default_rng(len(sizes))
    problems = np.repeat(np.arange(len(sizes)), sizes)
    values = rng.normal(size=len(problems)) + rng.normal(size=len(sizes))[problems]
    mean, se, df, low, high = _cr2_by_matrices(values, problems)
    got = clustered.mean_interval(values, problems.astype(str))
    assert got["estimate"] == pytest.approx(mean, rel=1e-12)
    assert got["se"] == pytest.approx(se, rel=1e-9)
    assert got["df"] == pytest.approx(df, rel=1e-9)
    assert (got["low"], got["high"]) == pytest.approx((low, high), rel=1e-9)
    if len(set(sizes)) == 1:
        assert got["df"] == pytest.approx(len(sizes) - 1, rel=1e-12)


def test_ratio_interval_vectorised_rows_equal_single_calls():
    rng = np.random.default_rng(3)
    num, den = rng.normal(size=(4, 6)), rng.integers(0, 5, size=(4, 6)).astype(float)
    den[1, :5] = 0  # one problem left: no interval
    rows = clustered.ratio_interval(num * den, den)
    for k in range(4):
        one = clustered.ratio_interval(num[k] * den[k], den[k])
        for key in ("estimate", "se", "df", "low", "high", "problems"):
            np.testing.assert_allclose(rows[key][k], one[key], rtol=1e-12, equal_nan=True)
    assert np.isnan(rows["low"][1]) and rows["problems"][1] == 1


def test_constant_values_give_a_point_and_one_problem_gives_nan():
    same = clustered.mean_interval(np.zeros(12), np.repeat(list("abc"), 4))
    assert (same["estimate"], same["low"], same["high"], same["se"]) == (0.0, 0.0, 0.0, 0.0)
    alone = clustered.mean_interval([1.0, 2.0, 3.0], ["a", "a", "a"])
    assert alone["estimate"] == 2.0 and np.isnan(alone["low"]) and np.isnan(alone["high"])


def test_bootstrap_counts_and_paired_ratios_match_a_loop():
    counts = clustered.bootstrap_counts(5, 300, seed=11)
    draws = np.random.default_rng(11).integers(0, 5, size=(300, 5))
    assert np.array_equal(counts, np.array([np.bincount(r, minlength=5) for r in draws]))
    assert (counts.sum(1) == 5).all()
    num = np.arange(10.0).reshape(5, 2)  # two steps, the same problems
    den = np.array([[1, 1], [2, 2], [1, 1], [3, 3], [1, 1]], dtype=float)
    reps = clustered.bootstrap_ratios(num, den, counts)
    loop = np.array([[sum(num[g, k] for g in r) / sum(den[g, k] for g in r) for k in (0, 1)]
                     for r in draws])
    np.testing.assert_allclose(reps, loop, rtol=1e-12)


def test_replicate_interval_is_the_small_sample_t():
    reps = np.array([1.0, 2.0, 3.0, 4.0, np.nan])
    low, high = clustered.replicate_interval(2.5, reps, n_problems=6)
    half = stats.t.ppf(0.975, 5) * np.std([1, 2, 3, 4], ddof=1) * np.sqrt(6 / 5)
    assert (low, high) == pytest.approx((2.5 - half, 2.5 + half), rel=1e-12)
    assert np.isnan(clustered.replicate_interval(2.5, reps, n_problems=1)[0])


def test_bootstrap_t_matches_a_loop_over_replicates():
    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 9, size=9).astype(float)
    num = np.stack([sizes * rng.normal(size=9), sizes * rng.normal(size=9)])
    den = np.stack([sizes, sizes])
    counts = clustered.bootstrap_counts(9, 400, seed=2)

    def ratio_and_se(n, d):
        r = n.sum() / d.sum()
        return r, np.sqrt(np.sum((n - r * d) ** 2)) / d.sum()

    got = clustered.bootstrap_t_interval(num, den, counts)
    for k in range(2):
        ratio, se = ratio_and_se(num[k], den[k])
        t_star = []
        for row in counts:
            drawn = np.repeat(np.arange(9), row.astype(int))  # duplicates count twice
            rep, rep_se = ratio_and_se(num[k][drawn], den[k][drawn])
            t_star.append((rep - ratio) / (rep_se if rep_se > 0 else se))
        q_low, q_high = np.quantile(t_star, [0.025, 0.975])
        assert got["low"][k] == pytest.approx(ratio - q_high * se, rel=1e-9)
        assert got["high"][k] == pytest.approx(ratio - q_low * se, rel=1e-9)
        assert got["se"][k] == pytest.approx(se, rel=1e-12)


def test_few_problems_get_the_cr2_interval_not_an_exploding_bootstrap_t():
    """With 3 problems a replicate often draws one problem three times: its spread is ~0
    and t* explodes (seen on the demo: an interval reaching 2.6e6)."""
    rng = np.random.default_rng(0)
    sizes = np.array([5.0, 40.0, 12.0])
    num = sizes * rng.normal(0.3, 0.2, size=3)
    got = clustered.bootstrap_t_interval(num, sizes, clustered.bootstrap_counts(3, 999, seed=1))
    want = clustered.ratio_interval(num, sizes)
    assert (got["low"], got["high"]) == pytest.approx((want["low"], want["high"]), rel=1e-12)
    assert np.isfinite(got["low"]) and got["high"] - got["low"] < 10


def test_bootstrap_t_of_constant_values_is_the_point_and_one_problem_is_nan():
    counts = clustered.bootstrap_counts(4, 50, seed=0)
    got = clustered.bootstrap_t_interval(np.zeros(4), np.array([3.0, 1, 2, 5]), counts)
    assert (got["estimate"], got["low"], got["high"]) == (0.0, 0.0, 0.0)
    alone = clustered.bootstrap_t_interval(np.array([2.0, 0, 0, 0]), np.array([4.0, 0, 0, 0]),
                                           counts)
    assert alone["estimate"] == 0.5 and np.isnan(alone["low"]) and alone["problems"] == 1


def _simulate(n_problems, n_sims, rng, lognormal=False):
    """Token values with a problem-level random effect (intra-class correlation 0.3 on
    the latent scale) and unequal problem sizes (5..40 tokens). Returns per-problem sizes
    and sums [S, G], each simulation's token values and problem codes, and the true mean.
    ``lognormal``: the tokens are exp() of that, skewed and heavy-tailed like KL."""
    sizes = rng.integers(5, 41, size=(n_sims, n_problems))
    effect = rng.normal(0, np.sqrt(ICC), size=(n_sims, n_problems))
    cell = np.repeat(np.arange(n_sims * n_problems), sizes.ravel())
    tokens = effect.ravel()[cell] + rng.normal(0, np.sqrt(1 - ICC), len(cell))
    truth = 0.0
    if lognormal:
        tokens, truth = np.exp(tokens), np.exp(0.5)  # E exp(N(0, 1))
    sums = np.bincount(cell, weights=tokens, minlength=sizes.size).reshape(sizes.shape)
    sim_of_token = cell // n_problems
    return sizes.astype(float), sums, tokens, sim_of_token, truth


def _coverages(n_problems, n_sims, seed, lognormal=False, n_boot=clustered.N_BOOT,
               n_token_boot=200):
    rng = np.random.default_rng(seed)
    sizes, sums, tokens, sim_of_token, truth = _simulate(n_problems, n_sims, rng, lognormal)
    # One count matrix for all simulations: their data are independent of it.
    counts = clustered.bootstrap_counts(n_problems, n_boot, seed + 1)

    def covered(low, high):
        return float(np.mean((low <= truth) & (truth <= high)))

    boot_t = clustered.bootstrap_t_interval(sums, sizes, counts)
    cr2 = clustered.ratio_interval(sums, sizes)
    reps = clustered.bootstrap_ratios(sums.T, sizes.T, counts)  # [B, S]
    se_t = clustered.replicate_interval(cr2["estimate"], reps, n_problems)
    pct = np.quantile(reps, [0.025, 0.975], axis=0)
    bounds = np.searchsorted(sim_of_token, np.arange(n_sims + 1))
    naive = []
    for s in range(n_sims):  # resamples tokens as if they were independent
        flat = tokens[bounds[s]:bounds[s + 1]]
        means = flat[rng.integers(0, len(flat), size=(n_token_boot, len(flat)))].mean(1)
        naive.append(np.quantile(means, [0.025, 0.975]))
    naive = np.array(naive).T
    return {"paired cluster bootstrap-t (chosen)": covered(boot_t["low"], boot_t["high"]),
            "cluster-robust t (CR2, Bell-McCaffrey)": covered(cr2["low"], cr2["high"]),
            "cluster bootstrap, t with bootstrap SE": covered(*se_t),
            "cluster bootstrap, percentile": covered(*pct),
            "token bootstrap, percentile (naive)": covered(*naive)}


def _report(title, cover):
    print(f"\n{title}: 95% intervals, share of runs covering the true mean")
    for name, value in cover.items():
        print(f"  {name:42s} {value:.3f}")


@pytest.mark.parametrize("n_problems", [9, 20, 100])
def test_interval_coverage_with_problem_random_effects(n_problems):
    n_sims = 1000 if n_problems < 100 else 500  # >= 500 each; 100 problems cost the most
    cover = _coverages(n_problems, n_sims, seed=n_problems)
    _report(f"{n_problems} problems, ICC {ICC}, normal tokens, {n_sims} simulations", cover)
    assert 0.93 <= cover["paired cluster bootstrap-t (chosen)"] <= 0.97
    assert 0.93 <= cover["cluster-robust t (CR2, Bell-McCaffrey)"] <= 0.97
    assert cover["token bootstrap, percentile (naive)"] < 0.75


@pytest.mark.parametrize("n_problems", [9, 20, 100])
def test_interval_coverage_on_skewed_tokens(n_problems):
    """Log-normal tokens (skewed like KL): every interval loses coverage with 9 problems,
    the bootstrap-t least (about 92.5% over 6,000 simulations when this was written, the
    symmetric t intervals about 90%); from 20 problems on it is back in 93-97%."""
    n_sims = 1000 if n_problems < 100 else 500
    cover = _coverages(n_problems, n_sims, seed=100 + n_problems, lognormal=True)
    _report(f"{n_problems} problems, ICC {ICC} (log scale), log-normal tokens, "
            f"{n_sims} simulations", cover)
    chosen = cover["paired cluster bootstrap-t (chosen)"]
    assert (0.90 if n_problems < 20 else 0.925) <= chosen <= 0.97
    assert chosen >= cover["cluster-robust t (CR2, Bell-McCaffrey)"] - 0.01
    assert cover["token bootstrap, percentile (naive)"] < 0.75


def test_a_replicate_with_only_rounding_for_spread_does_not_explode_the_interval():
    """Every problem has one labelled token among ~50: the ratios differ only through the
    lengths, and a replicate that misses the one odd problem has an SE of ~1e-18."""
    num, den = np.ones(8), np.array([49.0] + [51.0] * 7)
    got = clustered.bootstrap_t_interval(num, den, clustered.bootstrap_counts(8, 999, 1))
    assert got["low"] <= got["estimate"] <= got["high"] < 0.021


def _paired_problems(rng, g, effect):
    """Per problem: two categories' totals sharing a problem effect (the pairing)."""
    shared = rng.normal(0, 1.0, g)
    n_a, n_b = rng.integers(5, 30, g).astype(float), rng.integers(5, 30, g).astype(float)
    a = n_a * (shared + effect) + rng.normal(0, 1, g) * np.sqrt(n_a)
    b = n_b * shared + rng.normal(0, 1, g) * np.sqrt(n_b)
    return a, n_a, b, n_b


@pytest.mark.parametrize("g", [6, 12, 30])
def test_difference_interval_covers_and_uses_the_pairing(g):
    rng = np.random.default_rng(g)
    cover, widths, unpaired = 0, [], []
    sims = 300
    for i in range(sims):
        a, n_a, b, n_b = _paired_problems(rng, g, effect=0.5)
        counts = clustered.bootstrap_counts(g, 499, i)
        got = clustered.difference_interval(a, n_a, b, n_b, counts)
        truth = 0.5  # the shared problem effect has mean 0 on both sides
        cover += got["low"] <= truth <= got["high"]
        widths.append(got["high"] - got["low"])
        one = clustered.ratio_interval(a, n_a)
        two = clustered.ratio_interval(b, n_b)
        unpaired.append(np.hypot(one["high"] - one["low"], two["high"] - two["low"]))
    assert 0.91 <= cover / sims <= 0.99, cover / sims
    assert np.median(widths) < 0.8 * np.median(unpaired)  # the shared effect cancels


def test_difference_interval_without_spread_or_problems():
    same = clustered.difference_interval([2.0, 4.0], [1.0, 2.0], [1.0, 2.0], [1.0, 2.0],
                                         clustered.bootstrap_counts(2, 99, 0))
    assert same["estimate"] == 1.0 and same["low"] == same["high"] == 1.0
    one = clustered.difference_interval([2.0], [1.0], [1.0], [1.0],
                                        clustered.bootstrap_counts(1, 99, 0))
    assert one["estimate"] == 1.0 and np.isnan(one["low"])
    empty = clustered.difference_interval([0.0, 0.0], [0.0, 0.0], [1.0, 2.0], [1.0, 2.0],
                                          clustered.bootstrap_counts(2, 99, 0))
    assert np.isnan(empty["estimate"])


def test_an_interval_never_leaves_the_range_of_the_problems_own_means():
    """One problem with a huge value among many near zero (a heavy-tailed entropy decile):
    the bootstrap-t's replicates without it have a near-zero spread, and their t* pushed the
    upper bound far beyond every problem's own mean (1,197 nats around 0.072 on the demo)."""
    rng = np.random.default_rng(3)
    den = rng.integers(5, 40, size=30).astype(float)
    num = den * rng.exponential(0.01, size=30)
    num[7] = den[7] * 50.0  # one problem's tokens carry a large divergence
    res = clustered.bootstrap_t_interval(num, den, clustered.bootstrap_counts(30, 999, 0))
    own = num / den
    assert own.min() <= res["low"] <= res["estimate"] <= res["high"] <= own.max()
    low, high = clustered.within_problems(num, den, np.array([-5.0]), np.array([1e9]))
    assert (low[0], high[0]) == (own.min(), own.max())
    mixed = np.where(np.arange(30) == 3, -1.0, den)  # a negative denominator: no range to cut to
    assert clustered.within_problems(num, mixed, np.array([-5.0]), np.array([1e9])) == ([-5.0], [1e9])
