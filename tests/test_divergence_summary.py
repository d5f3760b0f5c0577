"""Chapter 04's aggregates against plain pandas recomputations on a synthetic table with
known answers, the checkpoint-equals-reference table (zeros everywhere), and every chart
rendered to SVG and PNG."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from synthetic_tokens import pair_metrics, synthetic_tokens

from rlprobe_nb import views
from rlprobe_nb.divergence import charts
from rlprobe_nb.divergence import entropy_concentration as ec
from rlprobe_nb.divergence import estimator_lab as el
from rlprobe_nb.divergence import summary as ds
from rlprobe_nb.divergence import token_categories as tc
from rlprobe_nb.tables import storage

METRICS = list(ds.METRICS)


@pytest.fixture(scope="module")
def tokens():
    return synthetic_tokens()


@pytest.fixture(scope="module")
def same():
    return synthetic_tokens(change=0.0)


def _aggregates(tokens) -> dict:
    return {"when": ds.when_table(tokens), "per_problem": ds.per_problem_means(tokens),
            "changes": ds.step_changes(tokens), "ecdf": ds.ecdf_table(tokens),
            "tails": ds.tail_table(tokens), "position": ds.position_table(tokens),
            "categories": ds.category_table(tokens, tc.classify(tokens)),
            "similarity": ds.step_similarity(tokens),
            "deciles": ec.entropy_decile_table(tokens), "share": ec.high_entropy_share(tokens),
            "lab": el.estimator_table(tokens), "scatter": el.estimator_scatter(tokens),
            "reweighted": el.reweighted_table(tokens)}


@pytest.fixture(scope="module")
def tables(tokens):
    return _aggregates(tokens)


@pytest.fixture(scope="module")
def same_tables(same):
    return _aggregates(same)


def _plain(tokens):
    return tokens[~tokens.first_token]


def _close(a, b, **kw):
    np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-10,
                               atol=1e-12, **kw)


def _brackets(table, col="estimate"):
    ok = table[[col, "low", "high"]].dropna()
    assert ((ok.low <= ok[col] + 1e-12) & (ok[col] <= ok.high + 1e-12)).all()


def test_analysed_rows_needs_one_reference(tokens):
    two = pd.concat([tokens, tokens.assign(reference="rlvr_step_100")])
    with pytest.raises(ValueError, match="one reference"):
        ds.when_table(two)


def test_when_table_means_match_pandas(tokens, tables):
    when = tables["when"]
    expected = _plain(tokens).groupby(["group", "step"])[METRICS].mean()
    got = when[when.step > 0].set_index(["group", "step", "metric"]).estimate.unstack("metric")
    _close(got[METRICS], expected)
    _brackets(when)
    itself = when[when.step == 0]
    assert (itself.checkpoint == "dpo").all()
    assert (itself[["estimate", "low", "high"]] == 0).all().all()
    assert set(itself.method) == {ds.ITSELF} and len(itself) == 3 * len(METRICS)
    # divergences grow with the step in this table, and are nonnegative
    kl = when[(when.metric == "kl_ref_ckpt") & (when.group == "target")].estimate.to_numpy()
    assert (np.diff(kl) > 0).all() and (when[when.metric != "dlogp"].low >= 0).all()


def test_per_problem_means_match_pandas(tokens, tables):
    lines = tables["per_problem"]
    expected = _plain(tokens).groupby(["group", "problem_id", "step"]).kl_ckpt_ref.mean()
    got = lines[(lines.metric == "kl_ckpt_ref") & (lines.step > 0)].set_index(
        ["group", "problem_id", "step"])["mean"]
    _close(got.sort_index(), expected.sort_index())
    assert (lines[lines.step == 0]["mean"] == 0).all()


def test_step_changes_are_paired_differences_of_means(tables):
    when = tables["when"].set_index(["group", "metric", "step"]).estimate
    changes = tables["changes"]
    for row in changes.itertuples():
        _close(row.change, when[(row.group, row.metric, row.step_to)]
               - when[(row.group, row.metric, row.step_from)])
    assert set(changes.step_from) == {0, 100, 200} and set(changes.step_to) == {100, 200, 400}
    _brackets(changes, "change")
    # Pairing: problems keep their level across steps, so a change is known better than
    # the two means it separates.
    table = tables["when"].set_index(["group", "metric", "step"])
    change = changes.set_index(["group", "metric", "step_to"]).loc[("target", "kl_ref_ckpt", 400)]
    separate = (table.loc[("target", "kl_ref_ckpt", 400)].se
                + table.loc[("target", "kl_ref_ckpt", 200)].se)
    assert change.se < separate


def test_ecdf_and_tails_match_numpy(tokens, tables):
    rows = _plain(tokens)
    ecdf = ds.ecdf_table(tokens, points=11)
    tails = tables["tails"]
    for (group, step), part in rows.groupby(["group", "step"]):
        values = part.kl_ref_ckpt.to_numpy()
        mine = ecdf[(ecdf.group == group) & (ecdf.step == step)]
        _close(mine.log10_value, np.quantile(np.log10(np.maximum(values, 1e-6)),
                                             np.linspace(0, 1, 11)))
        got = tails[(tails.group == group) & (tails.step == step)].set_index("statistic")
        _close(got.loc[["p90", "p99"], "estimate"], np.quantile(values, [0.9, 0.99]))
        _close(got.loc["share above 1 nat", "estimate"], np.mean(values > 1.0))
    _brackets(tails)
    assert (tails.low >= 0).all()


def test_position_table_matches_pandas(tokens, tables):
    table = tables["position"].set_index(["group", "metric", "scheme", "bin", "step"])
    length = tokens.groupby("rollout_id").pos.transform("max") + 1
    frame = tokens.assign(decile=(tokens.pos * 10 // length).clip(upper=9))
    plain = frame[~frame.first_token & ~frame.is_eos]
    for (group, step, decile), part in plain.groupby(["group", "step", "decile"]):
        label = f"{10 * decile}–{10 * decile + 10}%"
        _close(table.loc[(group, "dlogp", "relative", label, step)].estimate, part.dlogp.mean())
    for (group, step), part in plain[plain.pos.between(4, 7)].groupby(["group", "step"]):
        _close(table.loc[(group, "js", "absolute", "4–7", step)].estimate, part.js.mean())
    for (group, step), part in frame[frame.first_token].groupby(["group", "step"]):
        _close(table.loc[(group, "kl_ref_ckpt", "special", "first token", step)].estimate,
               part.kl_ref_ckpt.mean())
    for (group, step), part in frame[frame.is_eos].groupby(["group", "step"]):
        _close(table.loc[(group, "kl_ref_ckpt", "special", "EOS", step)].estimate,
               part.kl_ref_ckpt.mean())
    _brackets(table)


def test_category_table_matches_pandas(tokens, tables):
    categories = tc.classify(tokens)
    table = tables["categories"].set_index(
        ["group", "statistic", "category", "step"]).estimate
    rows = _plain(tokens.assign(category=categories.astype(str)))
    for (group, step), part in rows.groupby(["group", "step"]):
        share = part.category.value_counts(normalize=True)
        kl_share = part.groupby("category").kl_ckpt_ref.sum() / part.kl_ckpt_ref.sum()
        dlogp = part.groupby("category").dlogp.mean()
        for cat in share.index:
            _close(table[(group, "token_share", cat, step)], share[cat])
            _close(table[(group, "kl_ckpt_ref_share", cat, step)], kl_share[cat])
            _close(table[(group, "dlogp_mean", cat, step)], dlogp[cat])
        _close(table.loc[(group, "kl_ref_ckpt_share", slice(None), step)].sum(), 1.0)


def test_step_similarity_is_spearman(tokens, tables):
    sim = tables["similarity"]
    rows = _plain(tokens)
    for row in sim.itertuples():
        part = rows[rows.group == row.group]
        wide = part.pivot_table(index=["rollout_id", "pos"], columns="step",
                                values="kl_ref_ckpt")
        _close(row.spearman, stats.spearmanr(wide[row.step_a], wide[row.step_b]).statistic)
    _brackets(sim, "spearman")
    assert len(sim) == 3 * 3  # three groups, three pairs of steps


def test_entropy_deciles_match_pandas(tokens, tables):
    table = tables["deciles"].set_index(
        ["group", "metric", "entropy_decile", "step"]).estimate
    rows = _plain(tokens)
    for group, part in rows.groupby("group"):
        positions = part.drop_duplicates(["rollout_id", "pos"])
        order = np.argsort(positions.entropy_ref.to_numpy(), kind="stable")
        decile = np.empty(len(order), int)
        decile[order] = np.arange(len(order)) * 10 // len(order)
        lookup = pd.Series(decile, index=pd.MultiIndex.from_frame(positions[["rollout_id", "pos"]]))
        where = pd.MultiIndex.from_frame(part[["rollout_id", "pos"]])
        part = part.assign(d=lookup.reindex(where).to_numpy(),
                           change=part.entropy_ckpt - part.entropy_ref)
        for (d, step), cell in part.groupby(["d", "step"]):
            _close(table[(group, "kl_ref_ckpt", d, step)], cell.kl_ref_ckpt.mean())
            _close(table[(group, "entropy_change", d, step)], cell.change.mean())


def test_high_entropy_share_observed_matches_pandas(tokens, tables):
    share = tables["share"]
    rows = _plain(tokens)
    for (group, step), part in rows.groupby(["group", "step"]):
        positions = part.drop_duplicates(["rollout_id", "pos"])
        ranked = np.sort(positions.entropy_ref.to_numpy())[::-1]
        cut = ranked[int(np.ceil(0.2 * len(positions))) - 1]
        high = part.entropy_ref >= cut
        got = share[(share.group == group) & (share.step == step)].set_index("metric")
        for m in ("kl_ref_ckpt", "kl_ckpt_ref"):
            _close(got.loc[m, "estimate"], part.loc[high, m].sum() / part[m].sum())
    assert ((share.null_low <= share.null_mean) & (share.null_mean <= share.null_high)).all()


def test_permutation_null_matches_explicit_shuffles():
    rng = np.random.default_rng(4)
    problems = np.repeat(np.arange(6), [5, 9, 14, 3, 20, 7])
    values = rng.lognormal(0, 1.5, len(problems)) * (1 + problems)
    high = rng.random(len(problems)) < 0.3
    mean, low, high_band = ec.permutation_null(values, high, problems)
    shares = []
    for _ in range(20000):
        shuffled = values.copy()
        for g in range(6):
            at = np.flatnonzero(problems == g)
            shuffled[at] = rng.permutation(shuffled[at])
        shares.append(shuffled[high].sum() / values.sum())
    shares = np.array(shares)
    assert mean == pytest.approx(shares.mean(), abs=4 * shares.std() / np.sqrt(len(shares)))
    assert (high_band - mean) / 1.96 == pytest.approx(shares.std(), rel=0.03)
    assert low == pytest.approx(max(0.0, mean - 1.96 * shares.std()), rel=0.05)


def test_mechanical_share_is_exact_when_topk_holds_the_vocabulary():
    full = synthetic_tokens(n_problems=4, vocab=6, topk=6, seed=2)
    share = ec.high_entropy_share(full)
    assert np.allclose(share.mechanical_low, share.mechanical_high)
    rows = _plain(full)
    for (group, step), part in rows.groupby(["group", "step"]):
        room = 0.5 * (1 - np.array([np.sum(np.square(p)) for p in part.topk_p_ref]))
        high = ec.high_entropy_positions(part).to_numpy()
        got = share[(share.group == group) & (share.step == step)].mechanical_low.iloc[0]
        _close(got, room[high].sum() / room.sum())


def test_estimator_table_matches_pandas(tokens, tables):
    lab = tables["lab"]
    rows = _plain(tokens).assign(t=el.temperature_labels(tokens.temperature))
    key = ["group", "step", "t"]
    for (group, step, t), part in rows.groupby(key):
        for k in el.ESTIMATORS:
            for target in el.TARGETS:
                got = lab[(lab.group == group) & (lab.step == step) & (lab.level == "token")
                             & (lab.temperature_label == t) & (lab.estimator == k)
                             & (lab.target == target)].iloc[0]
                error = part[k] - part[target]
                _close(got.bias, error.mean())
                _close(got.spread, error.std())
                _close(got.spearman, stats.spearmanr(part[k], part[target]).statistic)
    seq = rows.groupby(["group", "rollout_id", "step", "t"])[["k3", "kl_ref_ckpt"]].mean()
    expected = (seq.k3 - seq.kl_ref_ckpt).groupby(["group", "step", "t"]).mean()
    got = lab[(lab.level == "sequence") & (lab.estimator == "k3") & (lab.target == "kl_ref_ckpt")]
    _close(got.set_index(["group", "step", "temperature_label"]).bias.sort_index(),
           expected.sort_index())


def _sampled_rows(q, p, temperature, n, seed, topk):
    """n tokens drawn from q at ``temperature``, each scored exactly against p."""
    rng = np.random.default_rng(seed)
    q_t = q ** (1 / temperature) / np.sum(q ** (1 / temperature))
    token = rng.choice(len(q), size=n, p=q_t)
    lq, lp = np.log(np.tile(q, (n, 1))), np.log(np.tile(p, (n, 1)))
    cols = pair_metrics(lp, lq, token, topk)
    return pd.DataFrame({**cols, "temperature": temperature})


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.4])
def test_importance_weights_turn_tempered_samples_back_into_kl(temperature):
    q = np.array([0.55, 0.2, 0.12, 0.07, 0.04, 0.02])
    p = np.array([0.30, 0.35, 0.10, 0.15, 0.06, 0.04])
    kl = float(np.sum(q * np.log(q / p)))
    q_t = q ** (1 / temperature) / np.sum(q ** (1 / temperature))
    tempered = float(np.sum(q_t * np.log(q / p)))  # E_{q_T}[k1] = KL(q_T‖p) − KL(q_T‖q)
    assert tempered == pytest.approx(np.sum(q_t * np.log(q_t / p)) - np.sum(q_t * np.log(q_t / q)))
    rows = _sampled_rows(q, p, temperature, 200_000, seed=1, topk=6)
    w_low, w_high = el.importance_weights(rows)
    _close(w_low, w_high)  # top-k holds the whole vocabulary: no tail, exact weights
    for k in ("k1", "k3"):
        weighted = w_low * rows[k]
        se = weighted.std() / np.sqrt(len(rows))
        assert weighted.mean() == pytest.approx(kl, abs=4 * se)
    k1 = rows.k1
    assert k1.mean() == pytest.approx(tempered, abs=4 * k1.std() / np.sqrt(len(rows)))
    if temperature == 1.0:
        assert (w_low == 1.0).all()
    else:
        assert abs(tempered - kl) > 8 * k1.std() / np.sqrt(len(rows))  # the bias is real


def test_importance_weight_bounds_hold_with_a_tail():
    q = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    for temperature, vocab in ((0.7, None), (1.3, 6)):
        rows = _sampled_rows(q, q[::-1], temperature, 500, seed=3, topk=3)
        low, high = el.importance_weights(rows, vocab_size=vocab)
        z = np.sum(q ** (1 / temperature))
        exact = np.exp(rows.logp_ref * (1 - 1 / temperature)) * z
        assert (low <= exact + 1e-12).all() and (exact <= high + 1e-12).all()
        assert np.isfinite(high).all()
    greedy = _sampled_rows(q, q, 1.0, 5, seed=0, topk=3).assign(temperature=0.0)
    assert np.isnan(el.importance_weights(greedy)[0]).all()


def test_checkpoint_equal_to_reference_gives_zeros(same_tables):
    t = same_tables
    for name in ("when", "position", "tails", "deciles"):
        assert (t[name][["estimate", "low", "high"]] == 0).all().all(), name
    assert (t["changes"][["change", "low", "high"]] == 0).all().all()
    assert (t["per_problem"]["mean"] == 0).all() and (t["ecdf"].log10_value == -6).all()
    lab = t["lab"]
    assert (lab[["mean_estimate", "mean_exact", "bias", "low", "high"]] == 0).all().all()
    categories = t["categories"]
    assert (categories[categories.statistic.str.endswith("_mean")].estimate == 0).all()
    assert categories[categories.statistic.str.startswith("kl_")
                      & categories.statistic.str.endswith("_share")].estimate.isna().all()
    assert t["similarity"].spearman.isna().all() and t["share"].estimate.isna().all()


def _all_charts(t: dict) -> dict:
    accuracy = pd.DataFrame({"model": ["dpo", "rlvr_step_100", "rlvr_step_200", "rlvr_step_400"],
                             "step": [0, 100, 200, 400], "rate": [0.1, 0.2, 0.3, 0.4],
                             "low": [0.05, 0.1, 0.2, 0.3], "high": [0.2, 0.3, 0.4, 0.5]})
    return {
        "when": charts.when_chart(t["when"], t["per_problem"], accuracy=accuracy),
        "ecdf": charts.ecdf_chart(t["ecdf"]),
        "tails": charts.tails_chart(t["tails"]),
        "position": charts.position_chart(t["position"]),
        "category_heatmap": charts.category_heatmap(t["categories"]),
        "category_shares": charts.category_share_chart(t["categories"]),
        "entropy": charts.entropy_chart(t["deciles"]),
        "concentration": charts.concentration_chart(t["share"]),
        "similarity": charts.similarity_heatmap(t["similarity"]),
        "groups": charts.group_contrast_chart(t["when"]),
        "estimator_bias": charts.estimator_bias_chart(t["lab"]),
        "estimator_scatter": charts.estimator_scatter_chart(t["scatter"]),
    }


@pytest.mark.parametrize("which", ["tables", "same_tables"])
def test_every_chart_renders(which, request, tmp_path):
    for name, chart in _all_charts(request.getfixturevalue(which)).items():
        shown = views.show(chart)
        assert shown.data.lstrip().startswith("<svg") and len(shown.data) > 5000, name
        assert shown.width <= views.MAX_WIDTH, f"{name} is {shown.width:.0f} px wide: cut in a 1280-px window"
    views.show(chart, save_as=tmp_path / name)  # and the files beside it
    assert (tmp_path / f"{name}.svg").stat().st_size > 1000
    assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


TABLE_NAMES = {"when": "divergence_when", "per_problem": "divergence_per_problem",
               "changes": "divergence_changes", "ecdf": "divergence_ecdf",
               "tails": "divergence_tails", "position": "divergence_position",
               "categories": "divergence_categories", "similarity": "divergence_similarity",
               "deciles": "entropy_deciles", "share": "entropy_share", "lab": "estimator_lab",
               "reweighted": "estimator_reweighted"}


@pytest.mark.parametrize("which", ["tables", "same_tables"])
def test_aggregates_are_written_with_their_schemas(which, request, tmp_path, monkeypatch):
    """Each aggregate goes through chapter 04's tables (``summary.chapter_tables``): written
    with its schema and read back with every row; a second run reads them back."""
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path))
    t, tokens = request.getfixturevalue(which), request.getfixturevalue("tokens")
    params = SimpleNamespace(suite="synthetic", files=[], as_dict=lambda: {"suite": "synthetic"},
                             checkpoints=[], reference="dpo")  # no token tables: key has none
    chapter = ds.chapter_tables(params, tokens, seed=0, min_problems=5)
    for key, name in TABLE_NAMES.items():
        back = chapter.get(name, lambda: t[key])
        assert len(back) == len(t[key]) and list(back.columns) == list(t[key].columns)
    assert storage.read_manifest(chapter.folders[TABLE_NAMES["when"]])["seeds"]["bootstrap"] == 0
    again = ds.chapter_tables(params, tokens, seed=0, min_problems=5)
    assert set(TABLE_NAMES.values()) <= again.reused


def test_change_table_for_display_names_directions(tables):
    shown = charts.changes_for_display(tables["changes"])
    assert shown.metric.str.contains("surprised").sum() == 2 * 3
    assert list(shown.columns[:3]) == ["metric", "from step", "to step"]
