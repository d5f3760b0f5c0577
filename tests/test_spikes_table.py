"""The spikes table end to end (schema, series, regions, context text) and the detector's
refusals of tables it cannot test."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.spikes import detect, regions, simulate, table
from rlprobe_nb.tables import schemas, storage


@pytest.fixture(scope="module")
def three_steps():
    ctx = simulate.make_contexts(n_problems=20, rollouts=2, length=(20, 40), vocab=64, seed=81)
    chosen = simulate.choose_plants(ctx, 0.03, kls=(3.0,), seed=81)
    # two adjacent spikes in one rollout make a region of two tokens
    rows = ctx.rows[(ctx.rows.problem == 3) & (ctx.rows.rollout == 0) & (ctx.rows.pos.isin([10, 11]))]
    adjacent = pd.DataFrame({"ctx": rows.ctx.to_numpy(), "kind": "redistributes", "kl": 3.0})
    plants = pd.concat([pd.concat([chosen, adjacent]).assign(step=s) for s in (1, 2)])
    tokens = simulate.simulate_tables(ctx, [0.3, 0.4, 0.5], [100, 200, 300], plants, seed=81)
    tokens["category"] = np.where(tokens.token_id % 2 == 0, "even", None)
    tests = detect(tokens)
    spikes, spans = table.spikes_table(tokens, tests)
    return tokens, tests, spikes, spans


def test_the_table_has_the_schema_and_writes(three_steps, tmp_path):
    tokens, _, spikes, spans = three_steps
    out = table.to_schema(spikes, suite="synthetic")
    storage.write_table(tmp_path / "spikes", out, schemas.SPIKES, {"suite": "synthetic"})
    back = storage.read_table(tmp_path / "spikes")
    assert len(back) == len(out) and list(back.columns) == schemas.SPIKES.names
    storage.to_arrow(table.to_schema(spans, "spike_regions"), schemas.SPIKE_REGIONS)


def test_rows_are_series_of_pairs_that_spike_at_some_step(three_steps):
    _, tests, spikes, _ = three_steps
    ever = spikes.groupby(["context_id", "token_id"]).significant.any()
    assert ever.all()
    assert spikes.groupby(["context_id", "token_id"]).step.nunique().eq(3).all()
    assert not spikes[spikes.step == 100].significant.all()  # the plants start at 200
    assert set(spikes.persistence) <= {"persistent", "transient", "sign_flip"}
    assert spikes.context.str.contains(r"\[", regex=True).all()
    at_spike = spikes[spikes.significant]
    assert at_spike.region_id.notna().all() and spikes[~spikes.significant].region_id.isna().all()
    assert at_spike.category.isin(["even", None]).all()


def test_adjacent_spikes_form_one_region(three_steps):
    tokens, _, _, spans = three_steps
    mine = spans[(spans.rollout_id == "p003#0") & (spans.pos_start <= 10) & (spans.pos_end >= 11)]
    assert len(mine) >= 1  # at step 200 or 300 (or both)
    span = mine.iloc[0]
    one = tokens[(tokens.rollout_id == "p003#0")
                 & (tokens.checkpoint == span.checkpoint)].set_index("pos")
    assert span.char_start == one.char_start[span.pos_start]
    assert span.char_end == one.char_end[span.pos_end]
    assert span.text == "".join(one.token[span.pos_start:span.pos_end + 1])


def test_merge_regions_on_hand_built_positions():
    positions = pd.DataFrame({
        "checkpoint": "c", "problem_id": "p", "rollout_id": ["r"] * 5 + ["s"],
        "pos": [3, 4, 5, 9, 10, 4], "char_start": [30, 40, 50, 90, 100, 40],
        "char_end": [40, 50, 60, 100, 110, 50], "divergence": 1.0,
        "sign": ["rejects", "rejects", "endorses", "rejects", "rejects", "rejects"]})
    out = regions.merge_regions(positions)
    assert out[["rollout_id", "pos_start", "pos_end", "char_start", "char_end", "n_spikes"]
               ].values.tolist() == [["r", 3, 5, 30, 60, 3], ["r", 9, 10, 90, 110, 2],
                                     ["s", 4, 4, 40, 50, 1]]
    assert out.signs.tolist() == ["endorses+rejects", "rejects", "rejects"]
    assert regions.merge_regions(positions, max_gap=4).region_id.tolist() == ["r@3-10", "s@4-4"]


def test_top_spikes_leave_out_the_first_token(three_steps):
    _, _, spikes, _ = three_steps
    top = table.top_spikes(spikes, n=50)
    assert len(top) > 0 and (top.pos > 0).all()


def test_detect_refuses_what_it_cannot_test(three_steps):
    tokens, _, _, _ = three_steps
    with pytest.raises(KeyError, match="context_id"):
        detect(tokens.drop(columns="context_id"))
    with pytest.raises(ValueError, match="unique"):
        detect(pd.concat([tokens.iloc[:10], tokens.iloc[:10]]))
    with pytest.raises(ValueError, match="two problems"):
        detect(tokens.assign(problem_id="one"))


def test_no_spike_at_any_step_gives_empty_tables_and_charts(three_steps, tmp_path):
    """A suite where nothing reaches significance (the honest result on small data) must
    still write its tables and draw its charts, saying that there is nothing to show."""
    from rlprobe_nb import views
    from rlprobe_nb.spikes import across_steps, charts

    tokens, tests, _, _ = three_steps
    none = tests.assign(significant=False)
    spikes, spans = table.spikes_table(tokens, none)
    assert spikes.empty and spans.empty
    storage.write_table(tmp_path / "spikes", table.to_schema(spikes, suite="synthetic"),
                        schemas.SPIKES, {"suite": "synthetic"})
    storage.write_table(tmp_path / "regions", table.to_schema(spans, "spike_regions"),
                        schemas.SPIKE_REGIONS, {"suite": "synthetic"})
    assert table.top_spikes(spikes).empty
    per_step = across_steps.new_persistent_per_step(spikes)
    for chart in (charts.raster_chart(spikes), charts.onset_heatmap(spikes),
                  charts.new_persistent_chart(per_step)):
        assert re.search(r"no (persistent )?spike", views.show(chart).data)
    strongest = table.strongest_departures(none, n=5)
    assert len(strongest) == 5 and strongest.p.is_monotonic_increasing


def test_strongest_departures_leave_out_departures_below_the_minimum_effect(three_steps):
    """A near-certain token whose log-odds moved while its probability barely did (a "."
    at Δlogp -0.006) once ranked among the strongest departures."""
    _, tests, _, _ = three_steps
    last = tests[tests.step == tests.step.max()]
    tiny = last.index[last.divergence < 0.1][:3]
    boosted = tests.copy()
    boosted.loc[tiny, "p"] = 1e-12  # the smallest p-values of all, on tiny departures
    strongest = table.strongest_departures(boosted, n=10, min_effect=0.1)
    assert (strongest.divergence >= 0.1).all()
    assert not strongest.p.eq(1e-12).any()


def test_chapter_05_reads_back_what_it_computed(three_steps, tmp_path):
    """Chapter 05 shows its tables as read back from disk (the same whether computed in
    this run or reused): the tests, spikes and regions it writes give every summary,
    ranking and chart the values the computed frames give (issue 34 item 2)."""
    from rlprobe_nb.spikes import across_steps, chapter, charts, spike_rates, summary

    tokens, tests, spikes, spans = three_steps
    written = {"spike_tests": chapter.tests_table(tokens, "synthetic")}
    written["spikes"], written["spike_regions"] = chapter.spikes_tables(
        tokens, written["spike_tests"], None, "synthetic")
    back = {}
    for name, frame in written.items():
        storage.write_table(tmp_path / name, frame, schemas.TABLES[name], {})
        back[name] = storage.read_table(tmp_path / name)
    read_tests, read_spikes = back["spike_tests"], back["spikes"]
    pd.testing.assert_frame_equal(summary(read_tests), summary(tests), check_dtype=False)
    pd.testing.assert_frame_equal(spike_rates(read_tests, by="group"),
                                  spike_rates(tests, by="group"), check_dtype=False)
    pd.testing.assert_frame_equal(table.strongest_departures(read_tests),
                                  table.strongest_departures(tests), check_dtype=False)
    for shown in (table.top_spikes, table.persistence_counts, across_steps.new_persistent_per_step):
        pd.testing.assert_frame_equal(shown(read_spikes), shown(spikes), check_dtype=False,
                                      check_index_type=False)
    for chart in (charts.raster_chart, charts.onset_heatmap):
        assert chart(read_spikes).to_dict() == chart(spikes).to_dict()
    assert len(back["spike_regions"]) == len(spans)


def test_a_reader_is_shown_only_spikes_whose_written_token_visibly_moved():
    import numpy as np

    from rlprobe_nb.spikes.table import visible_change

    rows = pd.DataFrame({  # written-token probabilities under the reference and checkpoint
        "logp_ref": np.log([0.987, 0.316, 0.40, 0.50]),
        "logp_ckpt": np.log([0.9999, 0.994, 0.42, 0.48]),
        "rank_ref": [1, 1, 2, 1], "rank_ckpt": [1, 1, 1, 1]})
    # near-certain and barely moved: out; a large move: in; a small move that makes the
    # token the most likely one: in; a small move of the top token: out
    assert visible_change(rows).tolist() == [False, True, True, False]


def test_every_spike_row_gets_chapter_04s_category_of_its_token(three_steps):
    """Token tables carry no category (the suite's never do): each row gets the one chapter
    04's classifier gives its written token, read in its rollout, never an empty one."""
    from rlprobe_nb.divergence import token_categories

    tokens, tests, _, _ = three_steps
    bare = tokens.drop(columns="category")
    spikes, _ = table.spikes_table(bare, tests)
    expected = token_categories.classify(bare).astype(str)
    assert len(spikes) and spikes.category.notna().all()
    assert (spikes.category.to_numpy() == expected.loc[spikes.row].to_numpy()).all()
    assert set(spikes.category) <= set(token_categories.CATEGORIES)
