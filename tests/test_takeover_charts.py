"""Chapter 09's curve chart: one panel per checkpoint, each drawing only its own rows
(a layer with data of its own is not split by the facet: every panel then drew every
checkpoint's curves, as the demo's page did at 7997876)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from rlprobe_nb.takeover import charts


def _curves() -> pd.DataFrame:
    rows = []
    for ckpt, step, acc in (("rlvr_step_100", 100, 0.5), ("rlvr_step_1200", 1200, 0.8)):
        for crit, budget, share, value in (("never", None, 0.0, 0.4), ("always", None, 1.0, acc),
                                           ("delta_logp", 0.02, 0.02, acc - 0.05),
                                           ("random", 0.02, 0.02, 0.41)):
            low = np.nan if crit in ("never", "always") else value - 0.1
            rows.append({"checkpoint": ckpt, "run": "rlvr", "step": step, "criterion": crit,
                         "budget": budget, "threshold": np.nan, "share_taken": share,
                         "share_changed": share, "acc": value, "acc_low": low,
                         "acc_high": low + 0.2, "problems": 100})
    return pd.DataFrame(rows)


def test_each_panel_draws_its_own_checkpoint_only():
    spec = charts.curve_chart(_curves(), "acc").to_dict()
    assert spec["facet"]["field"] == "panel" and "data" in spec
    layers = spec["spec"]["layer"]
    assert len(layers) == 2, "error bars and lines"
    assert all("data" not in layer for layer in layers), "every layer reads the faceted data"
    rows = spec["datasets"][spec["data"]["name"]]
    assert {r["panel"] for r in rows} == {"rlvr_step_100", "rlvr_step_1200"}
    assert any("isValid" in json.dumps(t) for t in layers[0].get("transform", []))


def test_no_error_bar_layer_without_an_interval():
    curves = _curves().assign(acc_low=np.nan, acc_high=np.nan)
    spec = charts.curve_chart(curves, "acc").to_dict()
    assert len(spec["spec"]["layer"]) == 1
