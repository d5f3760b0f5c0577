"""Chapter 05's charts: aggregated frames are right, and every chart renders to a static
SVG (no network, no kernel)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.spikes import across_steps, charts, detect, simulate, table


@pytest.fixture(scope="module")
def spikes():
    ctx = simulate.make_contexts(n_problems=16, rollouts=2, length=(20, 40), vocab=64, seed=91)
    chosen = simulate.choose_plants(ctx, 0.04, kls=(3.0,), seed=91)
    plants = pd.concat([chosen.assign(step=s) for s in (1, 2)])
    tokens = simulate.simulate_tables(ctx, [0.3, 0.4, 0.5], [100, 200, 300], plants, seed=91)
    out, _ = table.spikes_table(tokens, detect(tokens))
    return out


def test_calibration_frames_of_exact_uniform_quantiles():
    n = 999
    p = pd.DataFrame({"label": "u", "p": (np.arange(n) + 1) / (n + 1)})
    hist, qq = charts.calibration_frames(p, bins=10)
    np.testing.assert_allclose(hist.density, 1.0, atol=0.02)
    np.testing.assert_allclose(qq.observed, qq.expected, atol=1e-12)


def test_onset_frame_orders_by_onset(spikes):
    frame = charts.onset_frame(spikes, n=20)
    first = frame.drop_duplicates("label").sort_values("rank")
    assert first.onset_step.is_monotonic_increasing
    assert frame.groupby("label").step.nunique().eq(3).all()


def test_every_chart_renders_to_svg(spikes):
    import vl_convert as vlc

    pvalues = pd.DataFrame({"label": "data", "p": spikes.p.to_numpy()})
    per_step = across_steps.new_persistent_per_step(spikes)
    accuracy = pd.DataFrame({"step": [0, 100, 200, 300], "accuracy": [0.1, 0.2, 0.3, 0.35],
                             "low": [0.0, 0.1, 0.2, 0.25], "high": [0.2, 0.3, 0.4, 0.45]})
    for chart in (charts.calibration_chart(pvalues), charts.raster_chart(spikes),
                  charts.onset_heatmap(spikes), charts.new_persistent_chart(per_step, accuracy)):
        svg = vlc.vegalite_to_svg(chart.to_json())
        assert svg.startswith("<svg")
        assert "<script" not in svg and 'href="http' not in svg  # nothing fetched


def _png_size(chart) -> tuple[int, int]:
    import struct

    import vl_convert as vlc

    png = vlc.vegalite_to_png(chart.to_json())
    return struct.unpack(">II", png[16:24])


ACCURACY = pd.DataFrame({"model": ["dpo", "a", "b", "c"], "step": [0, 100, 200, 1200],
                         "accuracy": [0.0, 0.02, 0.3, 0.4], "low": [0.0, 0.01, 0.25, 0.35],
                         "high": [0.013, 0.05, 0.35, 0.45]})


def test_no_persistent_spike_gives_a_sentence_on_a_sane_axis():
    """An empty table once gave the accuracy curve an x domain of [0, 1] with steps up to
    1200 drawn outside it: a PNG 96,000 px wide."""
    per_step = across_steps.new_persistent_per_step(
        pd.DataFrame(columns=["step", "context_id", "persistence", "onset_step", "category"]))
    width, height = _png_size(charts.new_persistent_chart(per_step, ACCURACY))
    assert width < 1500 and height < 1000


def test_the_onset_chart_renders_under_the_accuracy_curve():
    from rlprobe_nb.spikes import onsets

    rows = []
    for label, effect in (("result_first_wrong", -1.0), ("format", 0.0), ("rare", -1.0)):
        for step in (100, 200, 1200):
            n = 2 if label == "rare" else 9
            rows.append({"scheme": "ground_truth", "category": label, "step": step,
                         "against": "reference", "estimate": effect * step / 1200 - 0.01,
                         "low": effect * step / 1200 - 0.2, "high": effect * step / 1200 + 0.1,
                         "problems": n, "rows": 40})
    table = pd.DataFrame(rows)
    found = onsets.onsets(table)
    assert found.set_index("category").onset_step["result_first_wrong"] == 200
    chart = charts.onset_chart(table, found, ACCURACY)
    spec = chart.to_dict()
    assert "rare" not in str(spec["vconcat"][1])  # too few problems: in the table, not the chart
    width, height = _png_size(chart)
    assert width < 1500 and height < 1500
    empty = charts.onset_chart(table.iloc[0:0], found.iloc[0:0], ACCURACY)
    assert "no label" in str(empty.to_dict())
