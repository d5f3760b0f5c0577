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
